"""The GGUF layer, below the store and the model: reading a GGUF file and
finding one.

- `file`: the GGUF reader (header, metadata, tensor directory, tensor bytes;
  no numpy or `gguf` package at import);
- `checks`: the header checks it makes before anything is sized from it;
- `config`: the `ModelConfig` (lever.model_config) of a GGUF, its tensor
  names and the llama q/k row order;
- `entry`: a registered model's record (parts, size, digest);
- `registry`: the models Lever knows by name and turning a name or path into
  a GGUF file; `assemble`: assembling and verifying a GGUF from its pinned
  part packages (in the cache directory, lever.values.cache_root).
"""
