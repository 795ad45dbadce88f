"""The hub package (ARCHITECTURE §5)."""
