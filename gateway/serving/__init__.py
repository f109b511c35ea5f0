"""Serving one HTTP request: the shared service, admission to the queue, quota metering,
and running its generations (start, prime, stream or collect, end)."""
