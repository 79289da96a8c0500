"""prodip stage: tokenizer (docs/tokenizer.md, docs/data.md)."""
