"""The inbox package (ARCHITECTURE §5)."""
