"""prodip stage: tokenizer (see README.md)."""
