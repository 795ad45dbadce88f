"""Tenants, memberships with roles, per-tenant API tokens, and the one place tenancy is enforced."""
