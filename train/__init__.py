"""prodip stage: train (docs/training.md)."""
