"""loragate.engine.models layer."""
