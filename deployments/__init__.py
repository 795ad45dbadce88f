"""The deployments package (ARCHITECTURE §5)."""
