"""prodip stage: train (see README.md)."""
