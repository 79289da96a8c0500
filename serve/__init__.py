"""prodip stage: serve (see README.md)."""
