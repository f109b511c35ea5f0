"""loragate.adapters layer."""
