"""loragate.kernels layer."""
