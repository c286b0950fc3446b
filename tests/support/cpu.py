"""What this machine's CPU is and can do, from /proc/cpuinfo: machines of one kind differ in CPU model, and both
the llama.cpp build and vLLM's dtype depend on it."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> tuple[str, frozenset[str]]:
    """The CPU model name and feature flags (x86 "flags", ARM "Features"); empty where unreadable."""
    model, flags = "", frozenset[str]()
    try:
        for line in cpuinfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "CPU part") and not model:
                model = value.strip()
            elif name.strip() in ("flags", "Features") and not flags:
                flags = frozenset(value.split())
    except OSError:
        pass
    return model, flags
