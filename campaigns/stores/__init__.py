"""Store implementations of the campaigns package: base (contract), memory (reference), kv."""
