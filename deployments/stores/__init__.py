"""Store implementations of the deployments package: base (contract), memory (reference), kv."""
