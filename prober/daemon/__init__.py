"""The continuous prober: scheduled jobs per target, Prometheus metrics, health, reload, incidents."""

from prober.daemon.service import Daemon, load_settings

__all__ = ["Daemon", "load_settings"]
