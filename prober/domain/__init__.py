"""What leakprobe reasons about, with no I/O: canaries, records, findings and their typed evidence, incidents,
and the one error hierarchy.  Every other package may import this one; it imports none of them."""
