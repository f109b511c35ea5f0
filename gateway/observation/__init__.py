"""Where the gateway is observed: Prometheus metrics (vLLM's names and loragate's own, the
metrics port), the traffic per adapter and tenant, the dashboard, /health, the start log and
the access log."""
