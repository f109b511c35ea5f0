"""OpenAI-compatible protocol: /v1/completions, /v1/chat/completions, /v1/models, /tokenize;
their msgspec schemas, prompts, sampling fields and response formatting."""
