"""The continuous prober: scheduled jobs per target, Prometheus metrics, health, reload, incidents."""

from prober.daemon.service import Daemon, open_daemon
from prober.daemon.settings import Settings, load_settings

__all__ = ["Daemon", "Settings", "load_settings", "open_daemon"]
