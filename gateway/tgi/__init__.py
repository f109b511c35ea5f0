"""TGI / LoRAX protocol: /generate, /generate_stream, / and /info; schemas and formatting."""
