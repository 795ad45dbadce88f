"""The crm package (ARCHITECTURE §5)."""
