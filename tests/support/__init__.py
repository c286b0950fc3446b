"""Everything the tests share but fixtures (those are in tests/conftest.py), and nothing in `prober` provides:
loopback and in-process servers shaped like engines, gateways and faults, the real engines' one-time builds, the
system tools some tests need, and the small helpers (ports, waits that follow progress, the CLI, the test keys)."""
