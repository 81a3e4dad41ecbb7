"""Assembling a run from its configuration (lever.config): the one place that
plans memory, opens a flash store (its manifest read once, handed down),
loads the target and the draft, sizes the KV caches, sets up mode lever's
policy and the early-exit probes, and makes the verifiers.

    config = RunConfig.from_args(args)                    # or RunConfig(TargetConfig(...), ...)
    run = build(config, tree_rows=..., sampling=..., kv=kv_rule(...))
    completion = run.generate(prompt, decode, spec=decode.spec(...))
    run.close()

The verifiers, one constructor each: `Run.verifier` (the target in this
process), `Run.verifier_server` (the target behind `lever serve-verifier`,
whose batcher shares passes between sessions) and `connect` (a target on a
server: `lever serve-verifier` or vLLM; what the edge client, lever.edge,
verifies with).  Commands are parse -> config -> build -> run -> report;
the Python API (`lever.load`, `lever.load_store`, `lever.make_drafter`)
goes through the loaders here too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .autoregressive import PREFILL_CHUNK, check_context, kv_tokens
from .config import (DEFAULT_DRAM_BUDGET, BackendConfig, DecodeConfig, DraftConfig, ReaderConfig, RemoteConfig,
                     RunConfig, TargetConfig)
from .draft.model_drafter import ModelDrafter
from .draft.ngram import NgramDrafter
from .engine import run_speculative, tree_room, verifier_capacity
from .errors import ContextOverflowError, StoreError, UsageError
from .gguf.file import GGUFFile
from .gguf.registry import resolve_model
from .loaded import Completion, LoadedModel
from .memory.rss import current_rss
from .memory.run_plan import kv_pass_rows, model_file, plan_run
from .mode_lever import lever_policy, save_calibration
from .model.loading import load_model
from .model.native_decoder import NativeDecoder
from .model.streamed_decoder import StreamedDecoder
from .model.tokenizer import Tokenizer
from .model.tokenizer_match import accept_drafter, check_run_tokenizers
from .npu.backend import use_static_backend
from .npu.buckets import BucketSet
from .npu.runtime import DEFAULT_SOC, QnnTarget
from .probe.choice import probe_forecast, probe_pruner, pruning_pays
from .sampling import SamplingParams
from .store.flash_reader import drop_page_cache
from .store.manifest import TOKENIZER, StoreManifest
from .values import cache_root
from .verify.target_pass import TargetVerifier

# -- KV sizing ---------------------------------------------------------------------

PROMPT_ALLOWANCE = 1024     # tokens: the prompt length budgeted when the prompt is not known yet
MIN_KV_TOKENS = 2048        # tokens: what `lever profile` assumes, so a cached profile's plan is found again

# kv(tokenizer or None, the store's context or None) -> KV rows per sequence
# (the rule itself: lever.autoregressive.kv_tokens, re-exported here)
KvRule = Callable[[Tokenizer | None, int | None], int]


def kv_rule(*, new_tokens: int, prompt_tokens: int = PROMPT_ALLOWANCE, extra: int = 0, floor: int = 0,
            sequences: int = 1, in_memory: int | None = None) -> KvRule:
    """The usual KV rule: `kv_tokens` clamped to a store's context; an
    in-memory target (no context known) gets `in_memory` rows if given."""
    def rule(_tokenizer, context):
        if context is None and in_memory is not None:
            return int(in_memory)
        return kv_tokens(prompt_tokens=prompt_tokens, new_tokens=new_tokens, extra=extra, floor=floor,
                         context=context, sequences=sequences)
    return rule


class PromptSetKv:
    """The KV rule of a run over a known prompt set (`lever bench`, `lever probe
    record`): the longest chat-formatted prompt + `new_tokens` + `extra` rows,
    at most the store's context; an in-memory target (whose tokenizer comes
    with the model) gets `in_memory` rows.  The store's encoding is kept in
    `ids` (one list of token ids per prompt), so the prompts are encoded once."""

    def __init__(self, texts: list[str], *, new_tokens: int, extra: int, in_memory: int):
        self.texts, self.new_tokens, self.extra, self.in_memory = texts, new_tokens, extra, in_memory
        self.ids: list[list[int]] = []

    def __call__(self, tokenizer, context) -> int:
        if tokenizer is None:
            return self.in_memory
        self.ids = [tokenizer.encode(tokenizer.format_prompt(t, chat=True)) for t in self.texts]
        return kv_tokens(prompt_tokens=max(map(len, self.ids)), new_tokens=self.new_tokens, extra=self.extra,
                         context=context)

    def prompt_ids(self, loaded: LoadedModel) -> list[list[int]]:
        """The prompts' token ids: the store's encoding, or the in-memory target's."""
        return self.ids or [loaded.prompt_ids(t) for t in self.texts]


# -- loaders (also the Python API's) ---------------------------------------------------

def load_manifest(store: Path) -> StoreManifest:
    """The store's manifest (checked); a damaged or missing one is one line naming `lever convert`."""
    try:
        return StoreManifest.load(store)
    except StoreError as e:
        if "lever convert" in str(e):
            raise
        raise StoreError(f"{e} (make one with `lever convert MODEL --out DIR`)") from None


def store_tokenizer(store_dir: str | Path, cache_dir: str | None = None) -> Tokenizer:
    """The tokenizer recorded in a flash store (its GGUF tokenizer metadata, as JSON).
    From the tokenizer cache, the metadata file is only hashed, never parsed."""
    return Tokenizer.from_metadata_file(Path(store_dir) / TOKENIZER, cache_dir=cache_root(cache_dir) / "tokenizers")


def load_in_memory(target: TargetConfig, cache_dir: str | None = None, progress: bool = True,
                   parsed: GGUFFile | None = None) -> LoadedModel:
    """A registered model, GGUF file or checkpoint directory held in DRAM, with
    its tokenizer; parsed: its GGUF header when already parsed (the memory plan's)."""
    t0 = time.perf_counter()
    root = cache_root(cache_dir)
    if parsed is not None and target.kernels == "native":
        path = parsed.path
    else:
        parsed, path = None, resolve_model(target.model, cache_dir=root, progress=progress)
    decoder, gguf = load_model(path, target.dtype, target.kernels, parsed=parsed)
    if gguf is None:
        tokenizer = Tokenizer.from_pretrained_dir(path)
    else:
        tokenizer = Tokenizer.from_gguf(gguf, cache_dir=root / "tokenizers")
    return LoadedModel(decoder, tokenizer, path, load_s=time.perf_counter() - t0)


def load_streamed(target: TargetConfig, reader: ReaderConfig, dram_budget: int, *, kv_tokens: int,
                  cache_dir: str | None = None, tokenizer: Tokenizer | None = None,
                  manifest: StoreManifest | None = None, backend: BackendConfig | None = None,
                  kv_pass_rows: int = PREFILL_CHUNK) -> LoadedModel:
    """The target streamed from its flash store under `dram_budget` bytes, with
    `kv_tokens` KV rows for passes of at most `kv_pass_rows` rows; tokenizer /
    manifest: already read (else read here); backend: where its layers run
    (`apply_backend`; None: not applied here)."""
    t0 = time.perf_counter()
    model = StreamedDecoder(target.store, dram_budget, target.dtype, backend=reader.backend,
                            prefetch_depth=reader.prefetch_depth, kv_tokens=kv_tokens,
                            queue_depth=reader.queue_depth, max_read_bytes_per_s=reader.read_limit,
                            manifest=manifest, kv_pass_rows=kv_pass_rows)
    tokenizer = tokenizer or store_tokenizer(target.store, cache_dir)
    if backend is not None:
        apply_backend(backend, model, cache_dir)
    return LoadedModel(model, tokenizer, Path(target.store), load_s=time.perf_counter() - t0)


def apply_backend(backend: BackendConfig, model, cache_dir: str | None = None):
    """Run `model`'s decoder layers (a NativeDecoder or StreamedDecoder, just
    loaded) on `backend`: the layer runner (lever.npu.layers.StaticLayers),
    or None on the native backend.  A static backend's context binaries are
    cached under `npu_root(cache_dir)`."""
    if not backend.static:
        return None
    if not isinstance(model, NativeDecoder):
        raise UsageError(f"--backend {backend.name} needs the native decoder (--kernels native and a GGUF model "
                         f"or a flash store)")
    return use_static_backend(model, backend.name, BucketSet.parse(backend.buckets, backend.contexts),
                              target=qnn_target(backend.name, backend.soc), root=npu_root(cache_dir))


def qnn_target(backend: str, soc: str | None):
    """The QnnTarget of `soc` (None: the default SoC) for the qnn backend, else None."""
    return QnnTarget(soc or DEFAULT_SOC) if backend == "qnn" else None


def npu_root(cache_dir: str | None = None) -> Path:
    """Where context binaries are cached: <cache root>/npu (cache_dir, $LEVER_CACHE_DIR, ~/.cache/lever)."""
    return cache_root(cache_dir) / "npu"


def load_drafter(draft: DraftConfig, *, dtype: str = "bfloat16", kernels: str = "native",
                 cache_dir: str | None = None, progress: bool = True, parsed: GGUFFile | None = None):
    """None (no draft), prompt lookup ("ngram") or a draft model kept in DRAM
    (a ModelDrafter, loaded without a tokenizer: it shares the target's ids).
    parsed: the draft's GGUF header when already parsed (the memory plan's)."""
    if not draft.name:
        return None
    if draft.name == "ngram":
        return NgramDrafter()
    if parsed is not None and kernels == "native":
        path = parsed.path
    else:
        parsed, path = None, resolve_model(draft.name, cache_dir=cache_root(cache_dir), progress=progress)
    model, _ = load_model(path, dtype, kernels, head_type=draft.head, parsed=parsed)
    return ModelDrafter(model, path=path)


def connect(remote: RemoteConfig, params: SamplingParams, *, vocab_size: int):
    """A verifier on a server, sampling with `params`: a
    lever.remote.client.RemoteVerifier for `lever serve-verifier`, a
    lever.remote.vllm_verifier.VllmVerifier for an unmodified vLLM server
    (vocab_size: the drafting model's vocabulary, in tokens)."""
    from .remote.client import RemoteVerifier        # http.client and ssl: only when a server is used,
    from .remote.vllm_verifier import VllmVerifier   # so `import lever.api` stays light
    if remote.engine == "vllm":
        return VllmVerifier(remote.url, params, vocab_size=vocab_size, model=remote.model, branches=remote.branches,
                            token=remote.token, retry_deadline_s=remote.retry_deadline_s, timeout_s=remote.timeout_s,
                            tls_ca=remote.tls_ca)
    return RemoteVerifier(remote.url, params, token=remote.token, retry_deadline_s=remote.retry_deadline_s,
                          timeout_s=remote.timeout_s, tls_ca=remote.tls_ca)


# -- the run ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Headers:
    """GGUF headers parsed while planning memory, handed to the loaders so that
    no file is parsed twice: the in-memory target's and the draft model's."""

    target: GGUFFile | None = None
    draft: GGUFFile | None = None


@dataclass
class Run:
    """A run's parts, as `build` assembled them.
    loaded: the target with its tokenizer; drafter: None, prompt lookup or a
    draft model; memory: the --memory-limit plan (None without one);
    kv_tokens: KV rows per sequence; dram_budget: a streamed target's budget
    (bytes; None in memory); manifest: a store's, read once; page_cache: what
    dropping the page cache did (None: not asked); layers: the target's
    static-shape layer runner (lever.npu.layers.StaticLayers; None on the
    native backend)."""

    config: RunConfig
    loaded: LoadedModel
    drafter: object
    memory: object
    kv_tokens: int
    dram_budget: int | None
    manifest: StoreManifest | None
    page_cache: str | None = None
    policies: list = field(default_factory=list)
    draft_gguf: GGUFFile | None = None        # the draft's header, parsed once by the memory plan
    layers: object = None

    @property
    def target(self):
        return self.loaded.model

    @property
    def streamed(self) -> bool:
        return self.config.target.streamed

    def load_draft(self) -> None:
        """Load the configured drafter (`load_drafter`) into `drafter`."""
        cfg = self.config
        self.drafter = load_drafter(cfg.draft, dtype=cfg.target.dtype, kernels=cfg.target.kernels,
                                    cache_dir=cfg.cache_dir, progress=cfg.progress, parsed=self.draft_gguf)
        accept_drafter(self.drafter, self.loaded.tokenizer)     # build checked the pair
        self.draft_gguf = None

    def pruner(self, choice: str):
        """The early-exit probe of this target (lever.probe.choice; "on", "off" or "auto"), or None."""
        return probe_pruner(self.target, choice, self.loaded.path, self.config.cache_dir)

    def lever_policy(self, decode: DecodeConfig, *, context_tokens: int, params: SamplingParams | None = None,
                     max_nodes: int | None = None, pruner=None, npu_profile=None, first: bool = True,
                     tune_ring: bool | None = None):
        """Mode lever's gain-cost policy for this target and draft model
        (lever.mode_lever.lever_policy): the device profile (re-measured with
        decode.reprofile), the tree limits of `decode` (max_nodes overrides
        lever_max_nodes), the calibration of `params` (default decode's
        sampling); a streamed target with --prefetch-depth auto has its read
        ring tuned.  pruner: the probe whose survival forecast the costs
        include; first: False for another policy of the same run (another
        sampling setting): no re-measuring, no ring tuning, no progress.
        tune_ring: overrides the ring-tuning choice."""
        policy = lever_policy(self.target, self.drafter, self.config, decode, target_id=self.loaded.path,
                              params=params, max_nodes=max_nodes, first=first, tune_ring=tune_ring,
                              pruning=probe_forecast(pruner), npu_profile=npu_profile, context_tokens=context_tokens)
        if pruner is not None:                 # score a pass only where pruning pays (its cost model)
            pruner.pays = pruning_pays(policy.cost, pruner)
        self.policies.append(policy)
        return policy

    def verifier(self, params: SamplingParams, *, capacity: int, pruner=None) -> TargetVerifier:
        """The target in this process as a verifier: one sequence of `capacity`
        KV rows (tokens), sampling with `params`; pruner: the early-exit probe
        scoring its passes (None: none)."""
        return TargetVerifier(self.target, params, capacity=capacity, pass_hook=pruner)

    def verifier_server(self, name: str, limits, **options):
        """The target as a verifier server's batched verifier (`lever
        serve-verifier`): a lever.remote.server.VerifierServer whose sessions'
        trees share target passes.  name: the model name it reports; limits:
        its lever.remote.protocol.Limits; options: VerifierServer's keywords
        (token, verify_cost, tokenizer, log, batch_window_s, max_batch_trees)."""
        from .remote.server import VerifierServer     # aiohttp: the server extra
        return VerifierServer(self.target, name, limits, **options)

    def generate(self, prompt: str, decode: DecodeConfig, *, spec=None, on_text=None) -> Completion:
        """Up to `decode.max_new_tokens` tokens after `prompt`, the target's own:
        plainly (spec None), or speculatively with the run's drafter, `spec`
        (a lever.engine.SpecConfig) and this target as the verifier
        (`verifier`).  on_text receives the text as it is produced."""
        p, loaded = decode.sampling, self.loaded
        ids = loaded.prompt_ids(prompt, chat=decode.chat)
        self.check_fits(len(ids), decode.max_new_tokens, spec)
        options = dict(max_new_tokens=decode.max_new_tokens, temperature=p.temperature, top_p=p.top_p,
                       top_k=p.top_k, seed=p.seed, chat=decode.chat, ignore_eos=decode.ignore_eos,
                       on_text=on_text, prompt_ids=ids)
        if spec is None:
            return loaded.generate(prompt, **options)
        check_context(len(ids), decode.max_new_tokens, self.target.config.max_context, *tree_room(self.target, spec))
        verifier = self.verifier(p, capacity=verifier_capacity(len(ids), decode.max_new_tokens, spec),
                                 pruner=spec.pruner)
        return loaded.generate(prompt, drafter=self.drafter, spec=spec, verifier=verifier, **options)

    def speculate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams, spec, *,
                  stop_ids: frozenset[int] = frozenset(), on_token=None, pace=None):
        """(GenerationResult, SpecStats) of one speculative generation of token
        ids on this target with the run's drafter (lever.engine.run_speculative
        over `verifier`): how `lever serve` decodes a request.  pace: the
        lever.autoregressive.PrefillPace of its prefill (None: the default chunks)."""
        check_context(len(prompt_ids), max_new_tokens, self.target.config.max_context,
                      *tree_room(self.target, spec))
        verifier = self.verifier(params, capacity=verifier_capacity(len(prompt_ids), max_new_tokens, spec),
                                 pruner=spec.pruner)
        drafter = self.drafter if spec.mode != "ar" else None        # mode ar: the target alone
        return run_speculative(verifier, drafter, prompt_ids, max_new_tokens, params, spec, stop_ids, on_token,
                               pace=pace)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int, spec=None) -> None:
        """With --context N: refuse a generation whose prompt, new tokens and
        tree rows need more than the N KV rows reserved (one line naming --context)."""
        rows = self.config.memory.context
        tree = spec.max_tree_nodes + 1 if spec is not None else 0
        if rows is not None and prompt_tokens + max_new_tokens + tree > rows:
            raise ContextOverflowError(
                f"--context {rows}: the prompt of {prompt_tokens} tokens plus {max_new_tokens} new tokens"
                f"{f' and a tree of {tree} rows' if tree else ''} need "
                f"{prompt_tokens + max_new_tokens + tree} KV rows; pass a larger --context or fewer new tokens")

    def save_calibrations(self) -> None:
        """Write what each lever policy's calibration learnt to its file."""
        for policy in self.policies:
            save_calibration(policy)

    def close(self) -> None:
        """Stop a streamed target's reader (threads, file descriptors)."""
        close = getattr(self.target, "close", None)
        if close is not None:
            close()


def build(config: RunConfig, *, tree_rows: int, sampling: bool, kv: KvRule, drop_caches: bool = False,
          load_draft: bool = True) -> Run:
    """Assemble the run of `config`: a streamed target's manifest and tokenizer
    (part of the measured baseline), the memory plan under --memory-limit
    (`tree_rows`: rows of the largest pass; `sampling`: logits rows are
    kept), the target loaded (the page cache dropped first with
    `drop_caches`) with its layers on the configured backend
    (`apply_backend`), and the drafter (unless not `load_draft`: then
    `Run.load_draft` later).  kv: the KV rule (`kv_rule`), given the
    store's tokenizer and context (None, None for an in-memory target)."""
    target, cache_dir = config.target, config.cache_dir
    manifest = tokenizer = None
    context = None
    if target.streamed:
        manifest = load_manifest(target.store)
        tokenizer = store_tokenizer(target.store, cache_dir)
        context = manifest.config.max_context
    kv_rows = int(kv(tokenizer, context))
    if config.memory.context is not None:          # --context: the rows asked for, at most the model's
        kv_rows = min(config.memory.context, context) if context is not None else config.memory.context
    memory, budget, headers = plan_memory(config, manifest=manifest, kv_tokens=kv_rows, tree_rows=tree_rows,
                                          sampling=sampling)
    # a draft model must share the target's tokenizer: compared from the headers, before anything loads
    headers = Headers(*check_run_tokenizers(config, tokenizer, headers.target, headers.draft))
    page_cache = drop_page_cache() if drop_caches else None
    if target.streamed:
        loaded = load_streamed(target, config.reader, budget, kv_tokens=kv_rows, cache_dir=cache_dir,
                               tokenizer=tokenizer, manifest=manifest, kv_pass_rows=kv_pass_rows(tree_rows))
    else:
        loaded = load_in_memory(target, cache_dir, progress=config.progress, parsed=headers.target)
    layers = apply_backend(config.backend, loaded.model, cache_dir)
    run = Run(config, loaded, None, memory, kv_rows, budget if target.streamed else None, manifest, page_cache,
              draft_gguf=headers.draft, layers=layers)
    if load_draft:
        run.load_draft()
    return run


def plan_memory(config: RunConfig, *, manifest: StoreManifest | None, kv_tokens: int, tree_rows: int,
                sampling: bool):
    """(the MemoryPlan or None, the streamed target's DRAM budget in bytes, the
    GGUF headers the plan parsed, for the loaders: `Headers`).  With --memory-limit the whole
    process is planned (lever.memory.run_plan) and the target gets what is
    left; otherwise --dram-budget (default DEFAULT_DRAM_BUDGET) is the
    target's and nothing else is bounded."""
    if config.memory.limit is None:
        return None, config.memory.dram_budget or DEFAULT_DRAM_BUDGET, Headers()
    target = config.target
    target_path = None if target.streamed else model_file(target.model, config.cache_dir)
    draft_path = model_file(config.draft.name, config.cache_dir) if config.draft.is_model else None
    baseline = current_rss()                  # the runtime before any header is parsed (run_plan.plan_run)
    target_gguf = GGUFFile(target_path) if target_path is not None else None
    draft_gguf = GGUFFile(draft_path) if draft_path is not None else None
    plan, budget = plan_run(config.memory.limit, target_store=target.store, manifest=manifest,
                            target_path=target_gguf, draft_path=draft_gguf, kv_tokens=kv_tokens, tree_rows=tree_rows, sampling=sampling,
                            dtype=target.dtype, prefetch_depth=config.reader.prefetch_depth,
                            draft_head=config.draft.head if draft_gguf is not None else "stored",
                            baseline_bytes=baseline, target_windowed_kv=config.backend.name == "native")
    return plan, budget, Headers(target_gguf, draft_gguf)
