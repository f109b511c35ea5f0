"""Serving one HTTP request: the served model (names, chat template, measured prompts),
generations (admission to the queue, quota metering; start, prime, stream or collect, end),
and the sampling every API shares."""
