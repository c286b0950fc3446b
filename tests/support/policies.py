"""How patient a test is with a real engine (llama.cpp, vLLM) running on a 2-core machine that other CPU-heavy
work shares: llama.cpp's prefill was measured at 2-6 tokens a second there under load (550 on an idle
machine), so a plain request's idle timeout is sized for the longest prompt the tests send (about 1,000
tokens) at that rate, not for a quiet machine.  A hung engine still ends the request."""

from __future__ import annotations

from prober.targets.transport import TransportPolicy

REAL_ENGINE = TransportPolicy(timeout_s=600.0, connect_timeout_s=10.0, retries=2, backoff_s=0.1,
                              max_body_bytes=4 << 20)

# A loopback server of the tests' own (tests/support/shaped.py): it answers at once or never.
FAST = TransportPolicy(timeout_s=5.0, connect_timeout_s=1.0, retries=2, backoff_s=0.01, max_body_bytes=4 << 20)
