"""`lever bench` set-up: the options resolved, the memory planned, the target
(and the resident reference), the drafter and the lever policies loaded, and
one warm-up run -- everything before the timed runs.

Sizes are bytes, times seconds, KV and prompt lengths tokens.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import DecodeConfig, ReaderConfig, RunConfig
from ..errors import LeverError
from ..runtime import PROMPT_ALLOWANCE, PromptSetKv, build, kv_tokens, load_streamed
from .bench_modes import LEVER, BenchMode, parse_modes, with_probe_twins

QUICK = dict(prompts=2, new_tokens=16, modes=["ar", "chain:4", "tree:16"])
FULL = dict(prompts=10, new_tokens=64, modes=["ar", "chain:4", "chain:6", "chain:8", "tree:16", "tree:32", "tree:64"])
EVERYTHING = 1 << 62                 # bytes: a DRAM budget that pins every extent of a store


@dataclass
class BenchSetup:
    """One bench: what the options ask for, then what is loaded for it."""

    prompts: list[dict]
    new_tokens: int
    modes: list[BenchMode]
    ar_added: bool
    params: object                   # lever.sampling.SamplingParams
    out_dir: Path
    ids: list[list[int]] = field(default_factory=list)     # prompt token ids, one list per prompt
    loaded: object = None            # lever.api.LoadedModel of the target
    target_name: str = ""
    store: Path | None = None
    manifest: object = None          # StoreManifest of a store target
    budget: int | None = None        # the store's DRAM budget (bytes); None in memory
    memory: object = None            # MemoryPlan under --memory-limit, else None
    kv_tokens: int = 0
    load_s: float = 0.0
    resident: object = None          # the store with every extent pinned (--resident)
    drafter: object = None
    stop_ids: frozenset = frozenset()
    policies: list = field(default_factory=list)
    calibration_start: list[int] = field(default_factory=list)
    page_cache: str = "not dropped"
    raw_read_bps: float | None = None  # the store's raw sequential read rate (bytes/s)
    probe_twins: set = field(default_factory=set)   # +probes modes added by --probes on|auto
    layers: object = None            # the target's static-shape layer runner (--backend cpu-static|qnn), else None
    ahead_added: bool = False        # drafting modes turned +ahead (the static backends' default)
    probes: str = "auto"             # --probes after the backend's checks (auto is off on a static backend)
    npu_profile: object = None       # the --npu-profile read (lever.npu.npu_profile.NpuProfile), else None
    run: object = None               # lever.runtime.Run: the assembled target, drafter, memory plan

    @property
    def target(self):
        return self.loaded.model

    @property
    def streamed(self) -> bool:
        """Whether the target streams from a flash store."""
        return hasattr(self.target, "reset_stats")

    @property
    def needs_draft(self) -> bool:
        return any(m.uses_draft for m in self.modes)

    @property
    def max_draft(self) -> int:
        """Draft tokens per iteration at most over the modes, plus the engine's headroom."""
        return max(m.max_draft for m in self.modes) + 2

    @property
    def tree_rows(self) -> int:
        """Rows of the largest target pass any mode makes (root + draft tokens)."""
        return 1 + max(m.max_draft for m in self.modes)


def default_out_dir() -> Path:
    here = Path.cwd()
    if (here / "bench" / "make_prompts.py").is_file():      # a Lever source checkout
        return here / "bench" / "results"
    return here / "lever-bench-results"


def plan_bench(args) -> BenchSetup:
    """The options resolved (presets, modes, sampling, prompts) and checked; nothing loaded."""
    from ..bench_prompts import load_prompts
    from ..sampling import SamplingParams

    from .static_backend import check_backend_args

    checks = check_backend_args(args, kernels=args.kernels, probes=args.probes)
    n_prompts, new_tokens = counts(args)
    modes, ar_added = parse_modes(mode_texts(args), add_ar=not args.no_ar_reference)
    modes, ahead_added = with_static_defaults(args, modes)
    asked = {m.label for m in modes}
    if checks.probes != "off":
        modes = with_probe_twins(modes)        # --probes auto drops them again without a worthwhile probe
    check_options(args, modes)
    try:
        params = SamplingParams(temperature=args.temperature, seed=args.seed)
    except ValueError as e:
        raise LeverError(str(e)) from None
    prompts = load_prompts(args.prompt_set, args.categories, n_prompts)
    out_dir = Path(args.out) if args.out else default_out_dir()
    return BenchSetup(prompts, new_tokens, modes, ar_added, params, out_dir,
                      probe_twins={m.label for m in modes} - asked,
                      ahead_added=bool(ahead_added), probes=checks.probes, npu_profile=checks.npu_profile)


def with_static_defaults(args, modes: list[BenchMode]) -> tuple[list[BenchMode], list[BenchMode]]:
    """On a static backend with a draft model every drafting mode drafts ahead
    (the draft on the CPU beside the target's layers on the NPU; `--no-draft-ahead`
    keeps the modes as written): (the modes, those turned +ahead)."""
    from .bench_modes import AHEAD, parse_mode
    from .static_backend import draft_ahead_default

    if not draft_ahead_default(args, args.draft):
        return modes, []
    out, added, seen = [], [], set()
    for m in modes:
        if m.uses_draft and not m.draft_ahead:
            m = parse_mode(m.label.removesuffix("+probes") + AHEAD + ("+probes" if m.probes else ""))
            added.append(m)
        if m.label not in seen:
            seen.add(m.label)
            out.append(m)
    return out, added


def counts(args) -> tuple[int, int]:
    """(prompts, new tokens per prompt): the options given, else the preset's (--quick or the full set)."""
    preset = QUICK if args.quick else FULL
    return (args.prompts if args.prompts is not None else preset["prompts"],
            args.max_new_tokens if args.max_new_tokens is not None else preset["new_tokens"])


def mode_texts(args) -> list[str]:
    """--modes, else the preset's modes plus lever with a draft model (lever needs draft probabilities)."""
    if args.modes is not None:
        return args.modes
    return (QUICK if args.quick else FULL)["modes"] + ([LEVER] if args.draft != "ngram" else [])


def check_options(args, modes: list[BenchMode]) -> None:
    """Refuse option combinations the bench cannot run, before anything loads."""
    if args.draft == "ngram" and any(m.lever_nodes for m in modes):
        raise LeverError("mode lever needs a draft model (--draft NAME); prompt lookup ('ngram') has "
                         "no draft probabilities to calibrate")
    if args.target_store and args.kernels == "torch":
        raise LeverError("--kernels torch runs in-memory models only (the torch reference); a --target-store "
                         "streams on the native decoder")
    if args.npu_profile and not any(m.lever_nodes for m in modes):
        raise LeverError("--npu-profile sizes the trees of mode lever; --modes has no lever mode")


def load_target(args, b: BenchSetup, cleanup: list) -> None:
    """Plan the memory (after the store's tokenizer, part of the measured
    baseline), then load the target, and the resident reference with --resident.
    KV rows: the longest prompt (an in-memory target: PROMPT_ALLOWANCE) + the
    new tokens + a pass's draft rows, at most the store's context."""
    t0 = time.perf_counter()
    config = RunConfig.from_args(args, draft=args.draft if b.needs_draft else None)
    kv = PromptSetKv([p["text"] for p in b.prompts], new_tokens=b.new_tokens, extra=b.max_draft + 2,
                     in_memory=kv_tokens(prompt_tokens=PROMPT_ALLOWANCE, new_tokens=b.new_tokens,
                                         extra=b.max_draft + 2))
    b.run = build(config, tree_rows=b.tree_rows, sampling=not b.params.greedy, kv=kv, load_draft=False)
    b.loaded, b.memory, b.kv_tokens = b.run.loaded, b.run.memory, b.run.kv_tokens
    b.target_name, b.store, b.manifest, b.budget = config.target.name, config.target.store, b.run.manifest, \
        b.run.dram_budget
    b.ids = kv.prompt_ids(b.loaded)
    if b.streamed:
        cleanup.append(b.target.close)          # the reader's threads and file descriptors
    b.layers = b.run.layers                   # None on the native backend
    b.load_s = time.perf_counter() - t0
    if args.resident and b.streamed:          # the same store with every extent pinned in DRAM
        b.resident = load_streamed(config.target, ReaderConfig(backend=config.reader.backend), EVERYTHING,
                                   kv_tokens=b.kv_tokens, tokenizer=b.loaded.tokenizer, manifest=b.manifest,
                                   backend=config.backend, cache_dir=config.cache_dir).model   # layers where the target's run
        cleanup.append(b.resident.close)


def load_draft(args, b: BenchSetup) -> None:
    """The drafter (when a mode drafts), the stop ids, and one lever policy per lever mode."""
    if b.needs_draft:
        b.run.load_draft()
    b.drafter = b.run.drafter
    b.stop_ids = frozenset() if args.ignore_eos else b.loaded.tokenizer.eos_token_ids
    if b.probe_twins and b.probes == "auto" and b.run.pruner("auto") is None:
        print("lever bench: --probes auto: no probe worth running for this target; running without the "
              "+probes twins", file=sys.stderr)
        b.modes = [m for m in b.modes if m.label not in b.probe_twins]
    for i, m in enumerate(b.modes):
        pruner = b.run.pruner("on") if m.probes else None
        if pruner is not None and not m.lever_nodes:
            b.modes[i] = m = replace(m, spec=replace(m.spec, pruner=pruner))
        if m.lever_nodes:
            decode = DecodeConfig(mode=LEVER, lever_max_nodes=m.lever_nodes, draft_ahead=m.draft_ahead,
                                  sampling=b.params)
            policy = b.run.lever_policy(decode, pruner=pruner, npu_profile=b.npu_profile,
                                        context_tokens=max(map(len, b.ids)) + b.new_tokens)
            b.policies.append(policy)
            b.modes[i] = replace(m, spec=decode.spec(policy=policy, pruner=pruner))
    b.calibration_start = [p.calibration.observations for p in b.policies]


def warm_up(args, b: BenchSetup) -> None:
    """One short run (allocations, the read ring, the drafter), then start cold:
    the page cache dropped with --drop-caches, the store's raw read rate measured
    and its statistics reset."""
    from ..engine import SpecConfig, speculative_generate
    from ..store.flash_reader import drop_page_cache

    warm_mode = next((m for m in b.modes if m.spec.mode != "ar"), b.modes[0])
    warm_spec = warm_mode.spec if warm_mode.spec.mode != LEVER else SpecConfig("tree")   # lever learns from runs
    speculative_generate(b.target, b.drafter if warm_mode.spec.mode != "ar" else None, b.ids[0], 2, b.params,
                         warm_spec, stop_ids=b.stop_ids)
    if b.resident is not None:
        speculative_generate(b.resident, None, b.ids[0], 2, b.params, SpecConfig("ar"), stop_ids=b.stop_ids)
    b.page_cache = drop_page_cache() if args.drop_caches else "not dropped"
    if b.streamed:
        from ..store.bandwidth import SWEEP_SLOTS, sequential_read
        b.raw_read_bps, _ = sequential_read(b.store, args.reader, args.read_limit,
                                            extent_bytes=sweep_extent(b.memory), slots=SWEEP_SLOTS,
                                            queue_depth=args.read_queue_depth)
        b.target.reset_stats()


def sweep_extent(plan) -> int:
    """Bytes per read of the raw read-rate sweep: bandwidth.SWEEP_EXTENT, or under
    --memory-limit small enough that the sweep's buffers (SWEEP_SLOTS of them) take
    at most half the plan's safety margin (at least 1 MiB, a multiple of 4 KiB)."""
    from ..store.bandwidth import SWEEP_EXTENT, SWEEP_SLOTS
    if plan is None:
        return SWEEP_EXTENT
    share = plan.margin_bytes // 2 // SWEEP_SLOTS
    return max(1 << 20, min(SWEEP_EXTENT, share // 4096 * 4096))
