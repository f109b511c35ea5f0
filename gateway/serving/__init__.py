"""Serving one HTTP request: the served model (names, chat template, measured prompts), the
request's accounting (accounting.py: its quota lease, queue places, metering and release, in
one RequestAccount), its generations (start, prime, stream or collect, end; run.py), and the
sampling every API shares."""
