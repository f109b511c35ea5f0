"""Adapter control: this replica's copy of the registry's adapters (records, catalog), the
manager that registers and retires them, adapter paths, usage counts, and sync with the store."""
