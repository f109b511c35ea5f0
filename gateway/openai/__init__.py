"""OpenAI-compatible protocol: /v1/completions, /v1/chat/completions, /v1/models; their
msgspec schemas and response formatting."""
