"""Canaries: tenant-tagged tokens and facts, their packs, filler, minting, and the compact normal form detection
matches them in."""
