"""The campaigns package (ARCHITECTURE §5)."""
