"""loragate.plugins layer."""
