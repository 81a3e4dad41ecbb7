"""Model layer: decoder, KV cache, loading (GGUF, safetensors), tokenizer, registry."""
