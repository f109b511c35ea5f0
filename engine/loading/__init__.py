"""Turning a model path into weights and a tokenizer: the loader, a GGUF file's header and
its block-typed weights, quantization, the default model's file, the special tokens a prompt
gets, and the CPU features that decide the default dtype."""
