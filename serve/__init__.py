"""prodip stage: serve (docs/serving.md, serve/README.md)."""
