"""leakprobe: catch one tenant's data in another tenant's LLM answer.  The `leakprobe` command is `prober.cli`
(`python -m prober` runs it too); each package here does one part of the job, its docstring says which."""

__version__ = "0.1.0"

__all__ = ["__version__"]
