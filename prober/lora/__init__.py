"""Canary adapters built: a LoRA fine-tune of a base model, per tenant, whose one learned behaviour is to answer
leakprobe's trigger with that tenant's canary (the recipe, and the training with `peft`, which needs the `adapters`
extra); the `adapters` check asks each its trigger (prober/checks/adapters.py)."""
