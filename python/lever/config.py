"""A run's configuration, typed and checked once.

Every command and the Python API describe a run with these frozen
dataclasses, made once -- from the parsed command line (`RunConfig.from_args`,
`DecodeConfig.from_args`) or from `lever.load(...)` keywords -- with every
value resolved there: sizes in bytes, the dtype's one spelling, the prefetch
depth as an int or "auto", paths as Paths, the decoding mode chosen.  A bad
value is one `LeverError` line.  Nothing downstream parses or normalises them
again, and nothing writes back into the argparse Namespace.

`lever.runtime.build(config, ...)` turns a RunConfig into the run's parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .engine import SpecConfig
from .errors import LeverError, UsageError
from .modes import MODES
from .sampling import SamplingParams
from .shapes import LeverLimits, TreeShape
from .store.flash_reader import DEFAULT_QUEUE_DEPTH
from .store.residency import AUTO_DEPTH, parse_prefetch_depth
from .values import dtype_name, parse_rate, parse_size

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_DRAM_BUDGET = 600_000_000      # bytes: the streamed target's budget when no memory option is given
KERNELS = ("native", "torch")
DRAFT_HEADS = ("stored", "q4_0")
READER_BACKENDS = ("auto", "io_uring", "pread")
BACKENDS = ("native", "cpu-static", "qnn")
REMOTE_ENGINES = ("lever", "vllm")
PROBE_CHOICES = ("on", "off", "auto")
FROM_ARGS = object()                   # RunConfig.from_args: take the value from the parsed options


def _choice(what: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UsageError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _dtype(value) -> str:
    try:
        return dtype_name(value)
    except ValueError as e:
        raise UsageError(str(e)) from None


@dataclass(frozen=True)
class TargetConfig:
    """The model whose output a run produces: a flash store streamed under a
    DRAM budget (`store`), else a model held in DRAM (`model`: a registered
    name, a GGUF file or a checkpoint directory).
    dtype: "bfloat16" or "float32" (the KV cache's element type on the native
    decoder, the compute dtype of the torch reference); kernels: "native"
    (quantised matrices multiplied by Lever's kernels) or "torch" (the torch
    reference, in-memory models only)."""

    model: str = DEFAULT_MODEL
    store: Path | None = None
    dtype: str = "bfloat16"
    kernels: str = "native"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype(self.dtype))
        _choice("kernels", self.kernels, KERNELS)
        if self.store is not None:
            object.__setattr__(self, "store", Path(self.store))
            if self.kernels == "torch":
                raise UsageError("--kernels torch runs in-memory models only (the torch reference); a "
                                 "flash store (--target-store) streams on the native decoder")

    @property
    def streamed(self) -> bool:
        return self.store is not None

    @property
    def name(self) -> str:
        """The store directory or the model, as the user gave it."""
        return str(self.store) if self.store is not None else self.model


@dataclass(frozen=True)
class DraftConfig:
    """The draft: None (no drafting), "ngram" (prompt lookup) or a model kept
    in DRAM (registered name or path); head: its output head "stored" or
    re-quantised to "q4_0" as it loads."""

    name: str | None = None
    head: str = "stored"

    def __post_init__(self) -> None:
        _choice("--draft-head", self.head, DRAFT_HEADS)

    @property
    def is_model(self) -> bool:
        """A draft model (not prompt lookup, not none): what mode lever and the memory plan need."""
        return bool(self.name) and self.name != "ngram"


@dataclass(frozen=True)
class ReaderConfig:
    """How a streamed target is read from flash.
    backend: auto | io_uring | pread; prefetch_depth: read buffers in the
    ring (1..16) or "auto"; queue_depth: 1 MiB chunk reads in flight;
    read_limit: a cap in bytes per second (0.0 = none)."""

    backend: str = "auto"
    prefetch_depth: int | str = AUTO_DEPTH
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    read_limit: float = 0.0

    def __post_init__(self) -> None:
        _choice("--reader", self.backend, READER_BACKENDS)
        object.__setattr__(self, "prefetch_depth", parse_prefetch_depth(self.prefetch_depth))
        object.__setattr__(self, "read_limit", parse_rate(self.read_limit))

    @property
    def auto_depth(self) -> bool:
        return self.prefetch_depth == AUTO_DEPTH


@dataclass(frozen=True)
class MemoryConfig:
    """limit: one limit for the whole process (bytes), planned by
    lever.memory.run_plan; dram_budget: what a streamed target alone may use
    (bytes).  At most one of the two; neither: a DRAM budget of
    DEFAULT_DRAM_BUDGET and nothing else bounded.  context: KV rows (tokens)
    per sequence the run reserves (--context; None: the command's rule, at
    most the model's context); a generation that needs more is refused."""

    limit: int | None = None
    dram_budget: int | None = None
    context: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.dram_budget is not None:
            raise UsageError("--memory-limit and --dram-budget are exclusive: give one")
        if self.context is not None and not (isinstance(self.context, int) and self.context >= 1):
            raise UsageError(f"--context must be a positive number of tokens, got {self.context!r}")
        for field_name in ("limit", "dram_budget"):
            value = getattr(self, field_name)
            if value is not None:
                object.__setattr__(self, field_name, parse_size(value))


@dataclass(frozen=True)
class BackendConfig:
    """Where the target's decoder layers run: "native" (Lever's CPU kernels) or
    a static-shape backend, "cpu-static" or "qnn" (lever.npu), over row
    buckets `buckets` (tree tokens per pass) x context buckets `contexts`
    (cached tokens), as the --buckets / --contexts texts (None: lever.npu's
    defaults); soc: the qnn SoC model (None: the default SoC).  Applied to
    the target by `lever.runtime.build`."""

    name: str = "native"
    buckets: str | None = None
    contexts: str | None = None
    soc: str | None = None

    def __post_init__(self) -> None:
        _choice("--backend", self.name, BACKENDS)

    @property
    def static(self) -> bool:
        """A static-shape backend (not the native one)."""
        return self.name != "native"


@dataclass(frozen=True)
class RunConfig:
    """Everything `lever.runtime.build` needs to assemble a run: the target,
    the draft, the flash reader, the memory option, where the target's layers
    run (the backend), the cache root (None: $LEVER_CACHE_DIR or
    ~/.cache/lever) and whether long steps print progress."""

    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    cache_dir: str | None = None
    progress: bool = True

    @classmethod
    def from_args(cls, args, *, target_model: str | None = None, draft: str | None | object = FROM_ARGS,
                  progress: bool | None = None) -> RunConfig:
        """The configuration of a parsed command line (read, never written), whose
        parser has every run option (commands.options; a command that does not
        offer one sets its value through the option's helper, offered=False).
        target_model: the in-memory target when the command names it otherwise
        than --model; draft: the draft to use (FROM_ARGS: --draft)."""
        store = args.target_store
        model = target_model or args.model or DEFAULT_MODEL
        return cls(
            target=TargetConfig(model=model, store=Path(store) if store else None, dtype=args.dtype,
                                kernels=args.kernels),
            draft=DraftConfig(name=args.draft if draft is FROM_ARGS else draft, head=args.draft_head),
            reader=ReaderConfig(backend=args.reader, prefetch_depth=args.prefetch_depth,
                                queue_depth=args.read_queue_depth, read_limit=args.read_limit),
            memory=MemoryConfig(limit=args.memory_limit, dram_budget=args.dram_budget, context=args.context),
            backend=BackendConfig(name=args.backend, buckets=args.buckets, contexts=args.contexts, soc=args.soc),
            cache_dir=args.cache_dir,
            progress=(not args.no_progress) if progress is None else progress)


@dataclass(frozen=True)
class RemoteConfig:
    """A target verified on a server (edge-cloud mode).
    url: http(s)://HOST:PORT; engine: "lever" (`lever serve-verifier`) or
    "vllm" (an unmodified vLLM OpenAI-compatible server); model: vLLM's
    served model name (None: the only one); branches: vLLM, greedy: the
    tree's best paths sent per request; token: the server's bearer token;
    tls_ca: PEM file of certificates to trust (None: the system's);
    timeout_s: seconds one HTTP exchange may take; retry_deadline_s:
    seconds to keep retrying an unanswered call; call_cost_s: seconds mode
    lever adds to each target call when sizing trees (0: fastest)."""

    url: str
    engine: str = "lever"
    model: str | None = None
    branches: int = 1
    token: str | None = None
    tls_ca: str | None = None
    timeout_s: float = 120.0
    retry_deadline_s: float = 30.0
    call_cost_s: float = 0.0

    def __post_init__(self) -> None:
        if self.engine not in REMOTE_ENGINES:
            raise LeverError(f"unknown remote engine {self.engine!r} (choose from {', '.join(REMOTE_ENGINES)})")
        if self.engine == "lever" and (self.model is not None or self.branches != 1):
            raise LeverError("--remote-model and --vllm-branches apply to --remote-engine vllm only")
        if not self.call_cost_s >= 0:
            raise LeverError(f"the cost of a target call must be >= 0 seconds, got {self.call_cost_s}")

    @classmethod
    def from_args(cls, args, *, token: str | None) -> RemoteConfig:
        """The --remote* options of a parsed command line; token: read from --token-file by the caller."""
        return cls(url=args.remote, engine=args.remote_engine, model=args.remote_model, branches=args.vllm_branches,
                   token=token, tls_ca=args.tls_ca, timeout_s=args.timeout, retry_deadline_s=args.retry_deadline,
                   call_cost_s=args.call_cost_ms / 1e3)


def default_mode(draft: str | None, streamed: bool) -> str:
    """lever with a draft model and a flash store, tree with another draft, else ar."""
    if not draft:
        return "ar"
    return "lever" if streamed and draft != "ngram" else "tree"


def check_mode(mode: str, draft: str | None) -> None:
    """Refuse a local decoding mode that the draft given cannot serve (before anything loads)."""
    needs = MODES[_choice("--mode", mode, tuple(MODES))]
    if needs.needs_draft and not draft:
        raise LeverError(f"--mode {mode} needs --draft (a draft model or 'ngram')")
    if needs.needs_draft_model and draft == "ngram":
        raise LeverError(f"--mode {mode} needs a draft model (--draft NAME); prompt lookup ('ngram') has no "
                         "draft probabilities to calibrate")


@dataclass(frozen=True)
class DecodeConfig:
    """How tokens are produced: the decoding mode (resolved: ar | chain |
    tree | lever), the chain length, the static tree, mode lever's tree
    limits, drafting ahead, early-exit probes (on | off | auto), re-measuring
    the device profile, the sampling settings and the token budget."""

    mode: str = "ar"
    draft_len: int = 4
    tree: TreeShape = TreeShape()
    lever_max_nodes: int = LeverLimits.max_nodes
    lever_max_depth: int = LeverLimits.max_depth
    lever_topk: int = LeverLimits.topk
    draft_ahead: bool = False
    probes: str = "auto"
    reprofile: bool = False
    sampling: SamplingParams = SamplingParams()
    max_new_tokens: int = 128
    chat: bool = True
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _choice("--mode", self.mode, tuple(MODES))
        _choice("--probes", self.probes, PROBE_CHOICES)

    @property
    def tree_rows(self) -> int:
        """Rows of the largest target pass the mode makes (root + draft tokens)."""
        return 1 + MODES[self.mode].draft_rows(self)

    @property
    def lever_limits(self) -> LeverLimits:
        """Mode lever's tree limits (--lever-max-nodes, --lever-max-depth, --lever-topk)."""
        return LeverLimits(self.lever_max_nodes, self.lever_max_depth, self.lever_topk)

    def spec(self, *, policy=None, pruner=None, mode: str | None = None) -> SpecConfig:
        """The decode loop's SpecConfig (lever.engine) of this decoding: its mode
        (or `mode`), chain length, static tree and drafting ahead; policy: mode
        lever's GainCostPolicy (lever.mode_lever); pruner: the early-exit
        probe of the target's passes (None: none)."""
        return SpecConfig(mode or self.mode, self.draft_len, self.tree, policy=policy, draft_ahead=self.draft_ahead,
                          pruner=pruner)

    @classmethod
    def from_args(cls, args, *, draft: str | None, streamed: bool, probes: str | None = None,
                  draft_ahead: bool = False, max_new_tokens: int | None = None, chat: bool | None = None,
                  ignore_eos: bool | None = None) -> DecodeConfig:
        """The decoding of a parsed command line with the decoding options
        (commands.options: add_spec_options, add_sampling_options(top=True),
        add_reprofile, add_max_new_tokens): --mode (default: `default_mode`,
        checked against `draft`), --draft-len, --tree-*, --lever-*, sampling.
        probes / draft_ahead: the values after the backend's checks
        (commands.static_backend); max_new_tokens: instead of --max-new-tokens;
        chat / ignore_eos: the command's --no-chat / --ignore-eos.  What the
        caller leaves None takes this class's default."""
        mode = args.mode or default_mode(draft, streamed)
        check_mode(mode, draft)
        try:
            tree = TreeShape(args.tree_budget, args.tree_topk, args.tree_depth)
            sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None
        given = {name: value for name, value in (("probes", probes), ("chat", chat), ("ignore_eos", ignore_eos))
                 if value is not None}
        return cls(mode=mode, draft_len=args.draft_len, tree=tree, lever_max_nodes=args.lever_max_nodes,
                   lever_max_depth=args.lever_max_depth, lever_topk=args.lever_topk, draft_ahead=draft_ahead,
                   reprofile=args.reprofile, sampling=sampling,
                   max_new_tokens=max_new_tokens if max_new_tokens is not None else args.max_new_tokens, **given)
