"""The `leakprobe` command line.  Each command is a thin shell over a library call; `app.py` turns every
`LeakprobeError` into one `error:` line and exit 2."""

from prober.cli import audit, canaries, daemon, drill, incidents, scan, testbed
from prober.cli.app import app

__all__ = ["app", "audit", "canaries", "daemon", "drill", "incidents", "main", "scan", "testbed"]


def main() -> None:
    app()
