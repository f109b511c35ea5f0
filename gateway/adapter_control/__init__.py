"""Adapter control: this replica's copy of the registry's adapters (served_adapters.py,
catalog), the manager that registers and retires them, adapter paths, the registry following
changed weights, sync with the registry, uploads, and the adapter store's objects."""
