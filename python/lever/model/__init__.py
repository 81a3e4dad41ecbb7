"""Model layer: the native decoder and its loaders (GGUF, flash store), the
streamed decoder, `load_model` (the one entry point; the torch reference
lives in lever.reference), the tokenizer and its chat templates."""
