"""A target's capacity: advertised context, KV pool, page size — each with its source — and the verdict."""

from prober.capacity.introspect import introspect, origin_of, reachability
from prober.capacity.limits import Capacity, Known, Verdict, assess

__all__ = ["Capacity", "Known", "Verdict", "assess", "introspect", "origin_of", "reachability"]
