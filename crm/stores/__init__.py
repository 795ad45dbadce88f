"""Store implementations of the crm package: base (contract), memory (reference), kv."""
