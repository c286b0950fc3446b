"""What many tests need and nothing in `prober` provides: free ports, waits that follow progress, the CLI
called in-process or as a process, the tenants' test keys, and what the reference engine's KV pool holds."""
