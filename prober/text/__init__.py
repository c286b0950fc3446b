"""Text handling that detection and reporting share: escapes undone with a map back to the original, secrets
scrubbed, sent prompts kept as keyed shingles.  Imports only the domain."""
