"""One request's generation on the engine thread of `lever serve`.

`Generator.run(req, job)` decodes with the run's `speculate`
(lever.runtime.Run.speculate: lever.engine.run_speculative over the
run's target verifier -- the decode loop `lever generate` runs -- in the server's mode (ar: the
target alone, chain, tree or lever), streams text to the job as it
is produced, and returns an `Outcome`.  Text is decoded as `lever generate`
decodes it (lever.model.tokenizer.IncrementalDecoder, special tokens
skipped); stop strings cut it (lever.serve.stop_strings).

The per-token callback stops the run: when the job is cancelled (its client
left) it raises `Cancelled`, when a stop string appears an internal
`StopString`; the engine hands back the partial result and counters with
the exception (`partial_result`, `partial_stats`), so a stopped run is
counted like any other.

The prefill runs in chunks (`PrefillPace`: SERVE_PREFILL_CHUNK tokens on a
target in DRAM, PREFILL_CHUNK on a flash target, each of whose forwards
streams the weights once); before each chunk the run stops with `Cancelled`
when its client has left, so a disconnect frees the engine within one chunk,
and with `PrefillTimeout` once the prefill has run longer than the server's
--max-prefill-seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..autoregressive import PREFILL_CHUNK
from ..engine import SpecConfig, tree_room
from ..errors import LeverError
from ..model.streamed_decoder import StreamedDecoder
from ..model.tokenizer import IncrementalDecoder
from ..mode_lever import save_calibration
from ..sampling import SamplingParams
from .generation_queue import Cancelled, Job
from .openai_schema import GenRequest
from .prom import EngineCounters
from .stop_strings import StopScanner


SERVE_PREFILL_CHUNK = 128      # prompt tokens per prefill forward on a target in DRAM: a cancelled or
                               # timed-out prefill stops after at most this many more tokens


class StopString(LeverError):
    """Raised from the token callback when a stop string has appeared."""


class PrefillTimeout(LeverError):
    """A request's prefill ran longer than the server allows (--max-prefill-seconds)."""


class PrefillPace:
    """The lever.autoregressive.PrefillPace of one request on the engine
    thread: chunks of `chunk` tokens; before each, `Cancelled` once `job` is
    cancelled and `PrefillTimeout` once the prefill (the target's and a draft
    model's together) has run more than `max_seconds` seconds (None: no
    limit).  Counts the prompt tokens each chunk runs in `counters.prefill_tokens`."""

    def __init__(self, job: Job, counters: EngineCounters, chunk: int, max_seconds: float | None):
        self.job, self.counters, self.chunk, self.max_seconds = job, counters, chunk, max_seconds
        self.started = time.monotonic()

    def __call__(self, done: int, total: int) -> int:
        """The next chunk's tokens, after `done` of `total` tokens are prefilled."""
        self.job.check()
        elapsed = time.monotonic() - self.started
        if self.max_seconds is not None and elapsed > self.max_seconds:
            raise PrefillTimeout(
                f"the prompt's prefill ran past this server's limit of {self.max_seconds:g} s "
                f"(--max-prefill-seconds): {done} of {total} tokens prefilled in {elapsed:.1f} s; "
                f"send a shorter prompt")
        self.counters.prefill_tokens += min(self.chunk, total - done)
        return self.chunk


@dataclass
class Outcome:
    text: str
    token_ids: list[int]
    finish_reason: str              # "stop" (end of turn or a stop string) or "length"
    speculative: dict


@dataclass
class Delta:
    """A piece of streamed output: text and the ids generated since the last piece."""

    text: str
    token_ids: list[int]


class Generator:
    """Runs requests on `loaded` (a lever.api.LoadedModel) with `drafter`
    (None in mode ar) under `spec_for(params)`, the lever.engine.SpecConfig
    of a request's sampling (lever.serve.specs).  draft: the --draft value,
    for the report; counters: the engine's counters, written on the engine
    thread; speculate: decodes one request's token ids
    (lever.runtime.Run.speculate); kv_limit: the KV rows --context reserves
    (None: the model's context, or a streamed target's planned rows)."""

    def __init__(self, loaded, drafter, spec_for: Callable[[SamplingParams], SpecConfig], draft: str | None,
                 counters: EngineCounters, speculate: Callable, kv_limit: int | None = None):
        self.loaded, self.drafter, self.spec_for, self.draft = loaded, drafter, spec_for, draft
        self.speculate, self.kv_limit = speculate, kv_limit
        self.counters = counters
        self.flash = isinstance(loaded.model, StreamedDecoder)     # the target streams from flash
        first = spec_for(SamplingParams())                    # mode lever: the greedy policy made (and profiled) now
        self.mode, self.tree_room = first.mode, tree_room(loaded.model, first)[0]
        self.tree_rows = first.max_tree_nodes + 1 if first.mode != "ar" else 0

    @property
    def context(self) -> int:
        """Tokens a request may use, prompt and completion: the model's context
        (a streamed target's: the KV rows its DRAM budget holds) less the room
        a draft tree needs past the last token."""
        context = min(self.loaded.config.max_context, getattr(self.loaded.model, "kv_tokens", 1 << 62)) - self.tree_room
        if self.kv_limit is not None:             # --context N: N KV rows, a whole tree's rows included
            context = min(context, self.kv_limit - self.tree_rows)
        return context

    def run(self, req: GenRequest, job: Job, max_prefill_s: float | None = None) -> Outcome:
        """Generate `req` (on the engine thread), posting Deltas to `job` when
        it streams; raises Cancelled once the job is cancelled (between two
        prefill chunks or two tokens), PrefillTimeout once its prefill has run
        more than `max_prefill_s` seconds (None: no limit)."""
        tokenizer = self.loaded.tokenizer
        decoder = IncrementalDecoder(tokenizer, skip_special_tokens=True)
        scanner = StopScanner(req.stop)
        pieces: list[str] = []
        unsent: list[int] = []

        def send(text: str) -> None:
            pieces.append(text)
            if req.stream:
                job.post(Delta(text, list(unsent)))
            unsent.clear()

        def on_token(token: int) -> None:
            job.check()
            unsent.append(token)
            text = scanner.push(decoder.push(token))
            if text or scanner.stopped:
                send(text)
            if scanner.stopped:
                raise StopString("a stop string appeared")

        result = stats = None
        spec = self.spec_for(req.params)
        pace = PrefillPace(job, self.counters, PREFILL_CHUNK if self.flash else SERVE_PREFILL_CHUNK, max_prefill_s)
        try:
            result, stats = self.speculate(req.prompt_ids, req.max_tokens, req.params, spec,
                                           stop_ids=tokenizer.eos_token_ids, on_token=on_token, pace=pace)
            tail = scanner.push(decoder.flush())
            send(tail + scanner.flush())
            finish = "stop" if result.stop_reason == "eos" or scanner.stopped else "length"
        except (StopString, Cancelled, PrefillTimeout) as e:
            result, stats = getattr(e, "partial_result", None), getattr(e, "partial_stats", None)
            if isinstance(e, PrefillTimeout):
                self.counters.prefill_timeouts += 1
            if not isinstance(e, StopString):
                raise
            self.counters.stop_strings += 1
            finish = "stop"
        finally:
            self.counters.add(len(req.prompt_ids), len(result.token_ids) if result else 0, stats)
            if spec.policy is not None:                 # mode lever: keep what the run taught its calibration
                save_calibration(spec.policy)
        return Outcome("".join(pieces), result.token_ids, finish, self.report(stats, len(result.token_ids),
                                                                              result.seed))

    def report(self, stats, new_tokens: int, seed: int | None) -> dict:
        """The `speculative` object of a response (see the module doc of lever.serve.app)."""
        passes = stats.iterations
        return {
            "mode": self.mode, "draft": self.draft, "target_passes": passes,
            "drafted": stats.draft_nodes, "accepted": stats.accepted,
            "mean_accepted_length": round(stats.mean_accepted_length, 3),
            "acceptance_rate": round(stats.accepted / stats.draft_nodes, 4) if stats.draft_nodes else None,
            "target": "flash" if self.flash else "dram",
            "bytes_read_per_token": (stats.bytes_read / new_tokens if new_tokens else 0.0) if self.flash else None,
            "seed": seed,
        }
