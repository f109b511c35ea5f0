"""Adapter control: this replica's copy of the registry's adapters (records, catalog), the
manager that registers and retires them, adapter paths, the registry following changed
weights, and sync with the store."""
