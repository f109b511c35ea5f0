"""Management routes: adapters (register, share, delete), tenants and usage; admin-only
routes use the `admin_only` guard."""
