"""A model with its tokenizer, ready to generate (`LoadedModel`), and what a
generation returns (`Completion`): the text, its tokens and timing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .autoregressive import GenerationResult, generate_tokens
from .engine import SpecConfig, run_speculative, speculative_generate
from .errors import LeverError
from .model_config import ModelConfig
from .model.tokenizer import IncrementalDecoder, Tokenizer
from .model.tokenizer_match import check_drafter
from .sampling import SamplingParams


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
                 prompt_ids: list[int] | None = None, ignore_eos: bool = False) -> Completion:
        """Generate a completion of `prompt` (wrapped in the chat template when the
        model has one and `chat`; `prompt_ids` replaces the encoded prompt).
        `on_text` receives the text as it is produced.
        With `drafter` and `spec` (a `lever.engine.SpecConfig`) decoding is
        speculative; the output is the same as without.  With `verifier` (a
        `lever.remote.client.RemoteVerifier`) the target is the verifier's and
        this model only drafts and tokenizes (see lever.edge).  A `drafter`
        without `spec` (and without `verifier`) is a LeverError: it would go
        unused, so it names the missing `spec` rather than decode plainly.
        ignore_eos: generate max_new_tokens tokens, not stopping at end-of-sequence."""
        if drafter is not None and spec is None and verifier is None:
            raise LeverError("generate(drafter=...) needs spec= to decode speculatively, e.g. "
                             "spec=SpecConfig(\"chain\", draft_len=4) (from lever.engine import SpecConfig); "
                             "without a drafter it decodes plainly")
        if drafter is not None:        # a draft model must share this model's tokenizer (checked once per drafter)
            check_drafter(self.tokenizer, drafter, self.path)
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        ids = list(prompt_ids) if prompt_ids is not None else self.prompt_ids(prompt, chat)
        stream = IncrementalDecoder(self.tokenizer, skip_special_tokens=True) if on_text else None
        on_token = (lambda t: on_text(stream.push(t))) if stream else None
        spec_stats = None
        stop_ids = frozenset() if ignore_eos else self.tokenizer.eos_token_ids
        if spec is None and verifier is None:
            result = generate_tokens(self.model, ids, max_new_tokens, params,
                                     stop_ids=stop_ids, on_token=on_token)
        elif verifier is None:
            result, spec_stats = speculative_generate(self.model, drafter, ids, max_new_tokens, params, spec,
                                                      stop_ids=stop_ids, on_token=on_token)
        else:
            result, spec_stats = run_speculative(verifier, drafter, ids, max_new_tokens, params,
                                                 spec or SpecConfig("ar"), stop_ids=stop_ids,
                                                 on_token=on_token)
        if stream:
            on_text(stream.flush())
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        return Completion(text=text, result=result, load_s=self.load_s, spec=spec_stats)
