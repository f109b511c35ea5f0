"""Operations, the top of the gateway: the app factory (every service built and handed to
the routes that use it) and its lifecycle, /health, /metrics and the dashboard, registry
care, the `loragate` CLI and its generated `serve` options, and server start (uvicorn, HTTP
limits, access log)."""
