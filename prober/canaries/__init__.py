"""Canaries: tenant-tagged tokens and facts, their packs, filler, and minting."""
