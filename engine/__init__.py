"""loragate.engine layer."""
