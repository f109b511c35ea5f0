"""Operations: the `loragate` CLI and its generated `serve` options, settings, metrics, and
server start (uvicorn, HTTP limits, access log)."""
