"""The continuous prober: scheduled jobs per target, Prometheus metrics, health, reload, incidents."""

from prober.daemon.service import Daemon, StartupError, load_settings

__all__ = ["Daemon", "StartupError", "load_settings"]
