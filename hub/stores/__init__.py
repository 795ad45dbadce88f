"""Store implementations of the hub package: base (contract), memory (reference), kv."""
