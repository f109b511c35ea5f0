"""An adapter's weights in the engine, one owner (adapter_residency): requests in flight per
adapter, events when the weights behind a name change, how many adapters stay resident
(lora_capacity), and adapters named by their adapter store object (stored_adapters)."""
