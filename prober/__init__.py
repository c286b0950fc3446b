"""leakprobe: catch one tenant's data in another tenant's LLM answer."""

__version__ = "0.1.0"

__all__ = ["__version__"]
