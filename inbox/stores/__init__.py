"""Store implementations of the inbox package: base (contract), memory (reference), kv."""
