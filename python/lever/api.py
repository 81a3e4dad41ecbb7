"""The Python API: `lever.load(...)` then `.generate(...)`, or `lever.generate(...)`."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .autoregressive import GenerationResult, generate_tokens
from .dtypes import dtype_name
from .model.config import ModelConfig
from .model.loading import load_model
from .model.registry import resolve_model
from .model.tokenizer import IncrementalDecoder, Tokenizer
from .sampling import SamplingParams

DEFAULT_MODEL = "smollm2-135m"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where assembled models and built tokenizers live: `cache_dir`, else
    $LEVER_CACHE_DIR, else ~/.cache/lever."""
    return Path(cache_dir or os.environ.get("LEVER_CACHE_DIR") or Path.home() / ".cache" / "lever")


@dataclass
class Completion:
    """Generated text with its tokens and timing (seconds)."""

    text: str
    result: GenerationResult
    load_s: float = 0.0
    spec: object = None             # lever.engine.SpecStats of a speculative run
    remote: dict | None = None      # edge-cloud mode: target calls, bytes, round trips (lever.remote)

    @property
    def token_ids(self) -> list[int]:
        return self.result.token_ids

    def to_json(self) -> dict:
        r = self.result
        return {
            "text": self.text,
            "token_ids": r.token_ids,
            "prompt_tokens": len(r.prompt_ids),
            "new_tokens": len(r.token_ids),
            "stop_reason": r.stop_reason,
            "seed": r.seed,
            "timing": {
                "load_s": round(self.load_s, 4),
                "prefill_s": round(r.prefill_s, 4),
                "decode_s": round(r.decode_s, 4),
                "prefill_tokens_per_s": round(len(r.prompt_ids) / r.prefill_s, 2) if r.prefill_s else None,
                "decode_tokens_per_s": round(r.decode_tokens_per_s, 2),
                "tokens_per_s": round(len(r.token_ids) / r.decode_s, 2) if r.decode_s else None,
            },
            **({"speculative": self.spec.to_json(len(r.token_ids))} if self.spec is not None else {}),
            **({"remote": self.remote} if self.remote is not None else {}),
        }


@dataclass
class LoadedModel:
    """A model (the numpy model protocol, lever.model.loading) with its tokenizer,
    ready to generate."""

    model: object
    tokenizer: Tokenizer
    path: Path
    load_s: float = 0.0

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def prompt_ids(self, prompt: str, chat: bool = True) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.format_prompt(prompt, chat=chat))

    def generate(self, prompt: str, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, chat: bool = True,
                 on_text: Callable[[str], None] | None = None, drafter=None, spec=None, verifier=None,
                 prompt_ids: list[int] | None = None) -> Completion:
        """Generate a completion of `prompt` (wrapped in the chat template when the
        model has one and `chat`; `prompt_ids` replaces the encoded prompt).
        `on_text` receives the text as it is produced.
        With `drafter` and `spec` (a `lever.engine.SpecConfig`) decoding is
        speculative; the output is the same as without.  With `verifier` (a
        `lever.remote.client.RemoteVerifier`) the target is the verifier's and
        this model only drafts and tokenizes (see lever.remote.edge)."""
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        ids = list(prompt_ids) if prompt_ids is not None else self.prompt_ids(prompt, chat)
        stream = IncrementalDecoder(self.tokenizer, skip_special_tokens=True) if on_text else None
        on_token = (lambda t: on_text(stream.push(t))) if stream else None
        spec_stats = None
        if spec is None and verifier is None:
            result = generate_tokens(self.model, ids, max_new_tokens, params,
                                     stop_ids=self.tokenizer.eos_token_ids, on_token=on_token)
        elif verifier is None:
            from .engine import speculative_generate
            result, spec_stats = speculative_generate(self.model, drafter, ids, max_new_tokens, params, spec,
                                                      stop_ids=self.tokenizer.eos_token_ids, on_token=on_token)
        else:
            from .engine import SpecConfig, run_speculative
            result, spec_stats = run_speculative(verifier, drafter, ids, max_new_tokens, params,
                                                 spec or SpecConfig("ar"), stop_ids=self.tokenizer.eos_token_ids,
                                                 on_token=on_token)
        if stream:
            on_text(stream.flush())
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        return Completion(text=text, result=result, load_s=self.load_s, spec=spec_stats)


def load(model: str = DEFAULT_MODEL, dtype: str = "bfloat16",
         cache_dir: str | os.PathLike | None = None, progress: bool = True,
         kernels: str = "native") -> LoadedModel:
    """Load a registered model by name (see `lever models`), a GGUF file, or a
    Hugging Face checkpoint directory.  dtype: "bfloat16" or "float32" (a torch
    dtype is accepted too when torch is already imported).  kernels "native":
    a GGUF runs on the native decoder (quantised matrices stay quantised);
    "torch": on the torch reference, every weight dequantised to `dtype`
    (needs the torch extra, as a checkpoint directory does)."""
    t0 = time.perf_counter()
    root = cache_root(cache_dir)
    path = resolve_model(model, cache_dir=root, progress=progress)
    decoder, gguf = load_model(path, dtype_name(dtype), kernels)
    if gguf is None:
        tokenizer = Tokenizer.from_pretrained_dir(path)
    else:
        tokenizer = Tokenizer.from_gguf(gguf, cache_dir=root / "tokenizers")
    return LoadedModel(decoder, tokenizer, path, load_s=time.perf_counter() - t0)


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
    from .store.flash_reader import DEFAULT_QUEUE_DEPTH
    from .store.residency import parse_rate, parse_size
    from .store.streamed import StreamedDecoder

    t0 = time.perf_counter()
    model = StreamedDecoder(store_dir, parse_size(dram_budget), dtype_name(dtype), backend=backend,
                            prefetch_depth=prefetch_depth, kv_tokens=kv_tokens,
                            queue_depth=DEFAULT_QUEUE_DEPTH if queue_depth is None else queue_depth,
                            max_read_bytes_per_s=parse_rate(max_read_bytes_per_s))
    tokenizer = tokenizer or store_tokenizer(store_dir, cache_dir)
    return LoadedModel(model, tokenizer, Path(store_dir), load_s=time.perf_counter() - t0)


def make_drafter(name: str, dtype: str = "bfloat16", cache_dir: str | os.PathLike | None = None,
                 progress: bool = True, kernels: str = "native", head: str = "stored"):
    """'ngram' (prompt lookup, no model) or a draft model (name or path) kept in
    DRAM, loaded as `load` does (kernels "native" or "torch") but without a
    tokenizer: the draft shares the target's token ids and never decodes text.
    head "q4_0": the draft's output head re-quantised to Q4_0 as it loads
    (fewer bytes per draft forward; lever.model.native_loader.ResidentWeights)."""
    if name == "ngram":
        from .draft.ngram import NgramDrafter
        return NgramDrafter()
    from .draft.model_drafter import ModelDrafter
    path = resolve_model(name, cache_dir=cache_root(cache_dir), progress=progress)
    model, _ = load_model(path, dtype_name(dtype), kernels, head_type=head)
    return ModelDrafter(model, path=path)


def store_tokenizer(store_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The tokenizer recorded in a flash store (its GGUF tokenizer metadata, as JSON).
    From the tokenizer cache, the metadata file is only hashed, never parsed."""
    from .store.manifest import TOKENIZER

    return Tokenizer.from_metadata_file(Path(store_dir) / TOKENIZER, cache_dir=cache_root(cache_dir) / "tokenizers")


def generate(prompt: str, model: str | LoadedModel = DEFAULT_MODEL, **kwargs) -> Completion:
    """One-shot: load `model` (unless already loaded) and generate from `prompt`."""
    loaded = model if isinstance(model, LoadedModel) else load(model)
    return loaded.generate(prompt, **kwargs)
