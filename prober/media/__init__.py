"""Media canaries: images that carry a tenant's canary as legible text (for a vision model to read back), the PNG
and data-URL form they travel in, the reference engine's stand-in for a vision encoder that reads them, and the
media digest whose truncation and shape-blindness the media-cache check constructs collisions against."""
