"""Where the app is assembled and started, the top of the gateway: the app factory, the
services it builds and hands to the routes, their lifecycle, the `loragate` CLI with its
generated `serve` options, and server start (uvicorn, HTTP limits, body depth)."""
