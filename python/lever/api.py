"""The Python API: `lever.load(...)` then `.generate(...)`, or `lever.generate(...)`."""

from __future__ import annotations

import os
from pathlib import Path

from .config import DEFAULT_MODEL, DraftConfig, MemoryConfig, ReaderConfig, TargetConfig
from .loaded import Completion, LoadedModel
from .model.tokenizer import Tokenizer
from .runtime import load_drafter, load_in_memory, load_streamed
from .runtime import store_tokenizer as runtime_store_tokenizer
from .values import cache_root

__all__ = ["DEFAULT_MODEL", "Completion", "LoadedModel", "cache_root", "generate", "load", "load_store",
           "make_drafter", "store_tokenizer"]


def load(model: str = DEFAULT_MODEL, dtype: str = "bfloat16",
         cache_dir: str | os.PathLike | None = None, progress: bool = True,
         kernels: str = "native") -> LoadedModel:
    """Load a registered model by name (see `lever models`), a GGUF file, or a
    Hugging Face checkpoint directory.  dtype: "bfloat16" or "float32" (also
    "bf16", "fp32", "f32", and a torch dtype when torch is already imported).
    kernels "native": a GGUF runs on the native decoder (quantised matrices
    stay quantised); "torch": on the torch reference, every weight dequantised
    to `dtype` (needs the torch extra, as a checkpoint directory does)."""
    target = TargetConfig(model=str(model), dtype=dtype, kernels=kernels)
    return load_in_memory(target, _dir(cache_dir), progress=progress)


def load_store(store_dir: str | os.PathLike, dram_budget: str | int, dtype: str = "bfloat16",
               backend: str = "auto", prefetch_depth: int | str = "auto", kv_tokens: int = 2048,
               cache_dir: str | os.PathLike | None = None,
               max_read_bytes_per_s: str | float = 0.0, tokenizer: Tokenizer | None = None,
               queue_depth: int | None = None) -> LoadedModel:
    """A target streamed from a flash store (`lever convert`) under a DRAM budget
    ('600MB', '1.5GiB' or bytes). Its `.model.report()` gives the I/O statistics.
    Quantised matrices are multiplied straight from the read buffers by the
    native kernels.
    max_read_bytes_per_s caps flash reads (bytes/s or '200MB/s'; 0 = unlimited).
    prefetch_depth: read buffers in the ring, 1..16, or "auto" (2; mode lever
    then chooses the depth from the profile, lever.cost.ring_depth).
    tokenizer: the store's tokenizer when already loaded (`store_tokenizer`).
    queue_depth: chunk reads in flight (None: the reader's default,
    lever.store.flash_reader.DEFAULT_QUEUE_DEPTH)."""
    target = TargetConfig(store=Path(store_dir), dtype=dtype)
    reader = ReaderConfig(backend=backend, prefetch_depth=prefetch_depth, read_limit=max_read_bytes_per_s,
                          **({} if queue_depth is None else {"queue_depth": queue_depth}))
    budget = MemoryConfig(dram_budget=dram_budget).dram_budget
    return load_streamed(target, reader, budget, kv_tokens=kv_tokens, cache_dir=_dir(cache_dir),
                         tokenizer=tokenizer)


def make_drafter(name: str, dtype: str = "bfloat16", cache_dir: str | os.PathLike | None = None,
                 progress: bool = True, kernels: str = "native", head: str = "stored"):
    """'ngram' (prompt lookup, no model) or a draft model (name or path) kept in
    DRAM, loaded as `load` does (kernels "native" or "torch") but without a
    tokenizer: the draft shares the target's token ids and never decodes text.
    head "q4_0": the draft's output head re-quantised to Q4_0 as it loads
    (fewer bytes per draft forward; lever.model.native_loader.ResidentWeights)."""
    target = TargetConfig(dtype=dtype, kernels=kernels)
    return load_drafter(DraftConfig(name=name, head=head), dtype=target.dtype, kernels=target.kernels,
                        cache_dir=_dir(cache_dir), progress=progress)


def store_tokenizer(store_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The tokenizer recorded in a flash store (its GGUF tokenizer metadata, as JSON)."""
    return runtime_store_tokenizer(store_dir, _dir(cache_dir))


def _dir(cache_dir) -> str | None:
    return None if cache_dir is None else str(cache_dir)


def generate(prompt: str, model: str | LoadedModel = DEFAULT_MODEL, **kwargs) -> Completion:
    """One-shot: load `model` (unless already loaded) and generate from `prompt`."""
    loaded = model if isinstance(model, LoadedModel) else load(model)
    return loaded.generate(prompt, **kwargs)
