"""prodip stage: export (see README.md)."""
