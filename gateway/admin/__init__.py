"""Management routes: adapters (register, share, delete), tenants and usage, health and
metrics; admin-only routes use the `admin_only` guard."""
