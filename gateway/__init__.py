"""loragate.gateway layer."""
