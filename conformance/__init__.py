"""prodip stage: conformance (see README.md)."""
