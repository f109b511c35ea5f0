"""Tenancy: who is calling (principal, auth), their quotas and usage, and the tenant service
behind the tenant routes (see ../TENANCY.md)."""
