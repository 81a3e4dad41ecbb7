"""The torch reference decoder (the `torch` extra): the block of
`lever.model_config.ModelConfig` in plain torch, its KV cache, the linear
operator over dense or quantised weights, and its loaders (GGUF, Hugging
Face checkpoints, a flash store read whole).

`torch_model` wraps it to the numpy model protocol and is the one module
here importable without torch (it imports the rest inside its functions);
`lever.model.loading.load_model(..., kernels="torch")` reaches it there.
"""
