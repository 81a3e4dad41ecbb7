"""Command-line options shared by several subcommands (one definition each).

A command that does not offer one of these options still gets its value
through the option's helper (`offered=False`: the default set on its parser,
not shown), so that the run configuration (lever.config `from_args`) reads
every value from the parsed command line and writes no fallback of its own."""

from __future__ import annotations

import argparse

from ..config import BACKENDS, DecodeConfig
from ..extras import install_hint
from ..modes import MODES
from ..sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, MIN_TOP_P
from ..shapes import LeverLimits, TreeShape
from ..store.flash_reader import DEFAULT_QUEUE_DEPTH
from . import arg_types
from .limits import (MAX_CONTEXT_TOKENS, MAX_DRAFT_LEN, MAX_NEW_TOKENS, MAX_PREFETCH_DEPTH, MAX_READ_QUEUE_DEPTH,
                     MAX_TREE_DEPTH, MAX_TREE_NODES, MAX_TREE_TOPK, MIN_READ_RATE)


def add_hidden_alias(p, alias: str, dest: str, **kwargs) -> None:
    """An old spelling of an option, kept for one release: it parses into `dest`
    like the option it was renamed to, and --help does not list it."""
    p.add_argument(alias, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


def add_target_choice(p) -> None:
    """--target-store DIR | --model NAME: a streamed or an in-memory target
    (--target: the old spelling of --model)."""
    target = p.add_mutually_exclusive_group()
    add_target_store(target)
    target.add_argument("--model", type=arg_types.name, default=None, metavar="NAME",
                        help="an in-memory target: registered model name, GGUF file or checkpoint dir "
                             "(default when no --target-store: smollm2-135m)")
    add_hidden_alias(target, "--target", "model", type=arg_types.name, metavar="NAME")


def add_max_new_tokens(p, *, default: int | None, help: str, lo: int = 1, old: str | None = None) -> None:
    """-n / --max-new-tokens N (tokens to generate at most, lo..MAX_NEW_TOKENS;
    -n as llama.cpp users type it, in every command that has the option);
    `old`: the option's previous spelling, kept as a hidden alias."""
    p.add_argument("--max-new-tokens", "-n", type=arg_types.integer(lo, MAX_NEW_TOKENS), default=default,
                   metavar="N", help=help)
    if old:
        add_hidden_alias(p, old, "max_new_tokens", type=arg_types.integer(lo, MAX_NEW_TOKENS), metavar="N")


def add_context(p, *, offered: bool = True) -> None:
    """--context N (alias --max-context): the tokens (prompt and output
    together) the KV caches are sized for, 1..MAX_CONTEXT_TOKENS, into
    `args.context`; None (the default) keeps the usual rule (lever.runtime.kv_rule:
    a prompt allowance + --max-new-tokens, for a store at least MIN_KV_TOKENS,
    at most the model's context).  Not `offered`: always the default."""
    if not offered:
        p.set_defaults(context=None)
        return
    p.add_argument("--context", "--max-context", dest="context", type=arg_types.integer(1, MAX_CONTEXT_TOKENS),
                   default=None, metavar="N",
                   help=f"size the KV cache for N tokens, prompt and output together, 1..{MAX_CONTEXT_TOKENS:,} "
                        f"(default: a 1,024-token prompt allowance + --max-new-tokens, for a --target-store at "
                        f"least 2,048, at most the model's context); a smaller N lowers a store's DRAM floor")


def add_target_store(p, instead_of: str = "--model", *, offered: bool = True) -> None:
    """--target-store DIR: stream the target from a flash store instead of `instead_of`
    (not `offered`: none)."""
    if not offered:
        p.set_defaults(target_store=None)
        return
    p.add_argument("--target-store", type=arg_types.store_dir, default=None, metavar="DIR",
                   help=f"stream the target from this store (see `lever convert`) instead of {instead_of}")


KERNELS_HELP = ("native: the native decoder, quantised matrices stay quantised and Lever's kernels multiply them "
                "(default); torch: the torch reference, weights dequantised to --dtype, torch matmul (needs "
                f"torch: {install_hint('torch')}; in-memory targets only)")


KERNELS_DEFAULT = "native"


def add_compute_options(p, *, kernels: bool = True) -> None:
    """--dtype (any spelling of float32 / bfloat16, parsed to its one name) and
    (with `kernels`; else always the native kernels) --kernels native|torch."""
    p.add_argument("--dtype", type=arg_types.dtype, default="bfloat16", metavar="DTYPE",
                   help="compute dtype: bfloat16 (bf16, the default) or float32 (fp32, f32): the KV cache's "
                        "element type on the native decoder, the compute dtype of the torch reference")
    if kernels:
        p.add_argument("--kernels", default=KERNELS_DEFAULT, choices=["native", "torch"], help=KERNELS_HELP)
    else:
        p.set_defaults(kernels=KERNELS_DEFAULT)




def add_dram_budget(p, what: str = "the streamed target") -> None:
    """--memory-limit SIZE (the whole process) or --dram-budget SIZE (the
    target only), mutually exclusive, parsed to bytes; neither: --dram-budget
    600MB (see `lever.runtime.plan_memory`)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--memory-limit", type=arg_types.size, default=None, metavar="SIZE",
                       help="one memory limit for the whole process (runtime, draft, target, KV, scratch): "
                            "the target gets what is left after the rest is measured or sized; a limit below "
                            "the run's minimum is refused with its parts listed")
    group.add_argument("--dram-budget", type=arg_types.size, default=None, metavar="SIZE",
                       help=f"DRAM {what} alone may use: pinned layers, buffers, KV cache; 600MB (10^6), "
                            f"1.5GiB (2^30) or bytes (default 600MB unless --memory-limit)")


def add_reader_options(p) -> None:
    """--reader, --prefetch-depth, --read-queue-depth and --read-limit (bytes/s) of a streamed target."""
    p.add_argument("--reader", default="auto", choices=["auto", "io_uring", "pread"],
                   help="flash reader backend (auto: io_uring, else a pread thread pool)")
    p.add_argument("--prefetch-depth", type=arg_types.prefetch_depth, default="auto", metavar="K|auto",
                   help=f"read buffers in the flash reader's ring (extents in flight ahead of the computing "
                        f"layer), 1..{MAX_PREFETCH_DEPTH}, or auto: 2, and in mode lever the depth whose simulated "
                        f"iteration is fastest under the same DRAM budget, from the profile (default auto)")
    p.add_argument("--read-queue-depth", type=arg_types.integer(1, MAX_READ_QUEUE_DEPTH),
                   default=DEFAULT_QUEUE_DEPTH, metavar="N",
                   help=f"chunk reads of 1 MiB the flash reader keeps in flight, 1..{MAX_READ_QUEUE_DEPTH} "
                        f"(default {DEFAULT_QUEUE_DEPTH}; bench/reader_queue_depth.py measures a device)")
    p.add_argument("--read-limit", type=arg_types.read_rate, default="0", metavar="RATE",
                   help=f"cap flash reads (and the loading of pinned layers) to emulate slower flash, e.g. "
                        f"200MB/s, 1.5GiB/s or bytes/s; at least {MIN_READ_RATE / 1e6:g}MB/s (default 0 = unlimited)")


def add_sampling_options(p, *, top: bool, seed_default: int | None) -> None:
    """--temperature, --seed and (with `top`) --top-p, --top-k, in the ranges of lever.sampling."""
    p.add_argument("--temperature", type=arg_types.temperature, default=0.0, metavar="T",
                   help=f"0 = greedy (default), else from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}")
    if top:
        p.add_argument("--top-p", type=arg_types.top_p, default=1.0, metavar="P",
                       help=f"nucleus sampling, from {MIN_TOP_P:g} to 1 (default 1 = off)")
        p.add_argument("--top-k", type=arg_types.top_k, default=0, metavar="K",
                       help="keep the K most likely tokens (default 0 = off)")
    p.add_argument("--seed", type=arg_types.seed, default=seed_default, metavar="S",
                   help=f"sampling seed, 0..2**63-1 (default: {'random' if seed_default is None else seed_default})")


def add_cache_dir(p) -> None:
    """--cache-dir DIR (created when missing)."""
    p.add_argument("--cache-dir", type=arg_types.directory, default=None, metavar="DIR",
                   help="cache root for assembled models, tokenizers and profiles "
                        "(default: $LEVER_CACHE_DIR or ~/.cache/lever)")


def add_backend_options(p, *, backend: bool = True, npu_profile: bool = True, offered: bool = True) -> None:
    """(With `backend`) --backend native|cpu-static|qnn, --buckets LIST, --contexts
    LIST, --soc ID and (with `npu_profile`) --npu-profile FILE (not `offered`:
    the native backend, none of these options shown): where the target's
    decoder layers run (lever.npu; checked by commands.static_backend, applied by
    lever.runtime.build as the run configuration's BackendConfig)."""
    from ..npu.buckets import DEFAULT_CONTEXTS, DEFAULT_ROWS
    from ..npu.runtime import DEFAULT_SOC, SOCS

    if not offered:
        p.set_defaults(backend=BACKENDS[0], buckets=None, contexts=None, soc=None, npu_profile=None)
        return

    g = p.add_argument_group("static-shape backends (NPU through ONNX Runtime; see `lever compile-npu`)")
    if backend:
        g.add_argument("--backend", default=BACKENDS[0], choices=BACKENDS,
                       help="where the target's decoder layers run: native = Lever's CPU kernels (default); "
                            "cpu-static = ONNX Runtime's CPU EP on static-shape bucket graphs; qnn = the QNN HTP "
                            "(an NPU; simulated on an x86-64 host, where its timings are not NPU speed). Static "
                            "backends pack each tree into a compiled (rows, context) bucket; needs onnxruntime: "
                            f"{install_hint('npu')}")
    g.add_argument("--buckets", type=arg_types.bucket_list("row buckets", MAX_TREE_NODES),
                   default=",".join(map(str, DEFAULT_ROWS)), metavar="LIST",
                   help=f"row buckets (tree tokens per pass) of a static backend, e.g. 1,8,16, each "
                        f"1..{MAX_TREE_NODES:,} (default {','.join(map(str, DEFAULT_ROWS))}); a larger tree is split")
    g.add_argument("--contexts", type=arg_types.bucket_list("context buckets", MAX_CONTEXT_TOKENS),
                   default=",".join(map(str, DEFAULT_CONTEXTS)), metavar="LIST",
                   help=f"context buckets (cached tokens) of a static backend, each 1..{MAX_CONTEXT_TOKENS:,}; the "
                        f"largest is the run's context limit (default {','.join(map(str, DEFAULT_CONTEXTS))})")
    g.add_argument("--soc", type=arg_types.soc_model, default=None, metavar="ID",
                   help=f"SoC model the qnn backend prepares graphs for: "
                        + ", ".join(f"{k} = {v[0]}" for k, v in SOCS.items()) + f" (default {DEFAULT_SOC})")
    if npu_profile:
        g.add_argument("--npu-profile", type=arg_types.name, default=None, metavar="FILE",
                       help="measured per-bucket layer times of a real device (JSON, schema lever-npu-profile/1, "
                            "see the README): mode lever sizes trees by them instead of a profile measured here")


DRAFT_HEAD_DEFAULT = "stored"


def add_draft_head(p, *, offered: bool = True) -> None:
    """--draft-head {stored,q4_0}: the draft model's output head as stored, or
    re-quantised to Q4_0 (not `offered`: as stored)."""
    if not offered:
        p.set_defaults(draft_head=DRAFT_HEAD_DEFAULT)
        return
    p.add_argument("--draft-head", default=DRAFT_HEAD_DEFAULT, choices=["stored", "q4_0"],
                   help="the draft model's output head as its file stores it, or re-quantised to Q4_0 as it "
                        "loads: fewer bytes per draft forward and in DRAM (native kernels; the target's "
                        f"output is the same either way; default {DRAFT_HEAD_DEFAULT})")


def add_spec_options(spec, mode_help: str) -> None:
    """The draft and tree-shape options of a decoding command (`generate`, `serve`):
    --draft, --draft-head, --mode (described by `mode_help`), --draft-len, --tree-budget/-topk/-depth
    and --lever-max-nodes/-max-depth/-topk, on the argument group `spec`."""
    add_draft(spec)
    add_draft_head(spec)
    spec.add_argument("--mode", default=None, choices=list(MODES), help=mode_help)
    k, tree, lever = DecodeConfig.draft_len, TreeShape(), LeverLimits()
    spec.add_argument("--draft-len", type=arg_types.integer(1, MAX_DRAFT_LEN), default=k, metavar="K",
                      help=f"chain length, 1..{MAX_DRAFT_LEN} (default {k})")
    spec.add_argument("--tree-budget", type=arg_types.integer(1, MAX_TREE_NODES), default=tree.budget, metavar="N",
                      help=f"draft nodes per tree, 1..{MAX_TREE_NODES} (default {tree.budget})")
    spec.add_argument("--tree-topk", type=arg_types.integer(1, MAX_TREE_TOPK), default=tree.topk, metavar="K",
                      help=f"children per node, 1..{MAX_TREE_TOPK} (default {tree.topk})")
    spec.add_argument("--tree-depth", type=arg_types.integer(1, MAX_TREE_DEPTH), default=tree.depth, metavar="D",
                      help=f"tree levels, 1..{MAX_TREE_DEPTH} (default {tree.depth})")
    spec.add_argument("--lever-max-nodes", type=arg_types.integer(1, MAX_TREE_NODES), default=lever.max_nodes,
                      metavar="N", help=f"mode lever: draft nodes per tree at most, 1..{MAX_TREE_NODES} "
                                        f"(default {lever.max_nodes})")
    spec.add_argument("--lever-max-depth", type=arg_types.integer(1, MAX_TREE_DEPTH), default=lever.max_depth,
                      metavar="D", help=f"mode lever: deepest draft node, 1..{MAX_TREE_DEPTH} "
                                        f"(default {lever.max_depth})")
    spec.add_argument("--lever-topk", type=arg_types.integer(1, MAX_TREE_TOPK), default=lever.topk, metavar="K",
                      help=f"mode lever: children the draft offers per expanded node, 1..{MAX_TREE_TOPK} "
                           f"(default {lever.topk})")


def add_draft(p, *, default: str | None = None, required: bool = False, note: str = "",
              offered: bool = True) -> None:
    """--draft NAME: the draft model kept in DRAM (registered name or path) or
    'ngram' (prompt lookup); `note` ends the help (what this command needs of it).
    Not `offered`: `default` (None: no draft)."""
    if not offered:
        p.set_defaults(draft=default)
        return
    p.add_argument("--draft", type=arg_types.name, default=default, required=required, metavar="NAME",
                   help="draft model kept in DRAM (registered name or path), or 'ngram' (prompt lookup)"
                        + (f"; {note}" if note else ""))


def add_probes(p, *, default: str, help: str) -> None:
    """--probes on|off|auto: early-exit pruning with the target's trained probe (`lever probe train`)."""
    p.add_argument("--probes", default=default, choices=["on", "off", "auto"], help=help)


def add_reprofile(p) -> None:
    """--reprofile: mode lever measures the device profile again, in full."""
    p.add_argument("--reprofile", action="store_true",
                   help="mode lever: measure the device profile again, in full (every layer, about a minute), "
                        "even if one is cached; without it a first run estimates the profile in seconds")


def add_no_progress(p, *, offered: bool = True) -> None:
    """--no-progress: no progress lines or bars on stderr (not `offered`: progress shown)."""
    if not offered:
        p.set_defaults(no_progress=False)
        return
    p.add_argument("--no-progress", action="store_true", help="no progress lines or bars on stderr")


def add_server_address(p, *, port: int, token_help: str) -> None:
    """--host, --port and --token-file of a server (`lever serve`, `lever serve-verifier`)."""
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any other address needs --token-file)")
    p.add_argument("--port", type=arg_types.integer(0, 65535), default=port, help=f"port (default {port}; 0: any free)")
    p.add_argument("--token-file", type=arg_types.name, default=None, metavar="F",
                   help="file holding the bearer token clients must send " + token_help
                        + ": at least 16 printable ASCII characters, readable by its owner only (chmod 600)")


def add_keepalive_and_drain(p) -> None:
    """--keepalive-timeout and --drain-seconds of a server (`lever serve`, `lever serve-verifier`)."""
    p.add_argument("--keepalive-timeout", type=arg_types.real(0.01, 3600), default=5.0, metavar="SECONDS",
                   help="close a keep-alive connection idle this long between requests (default 5)")
    p.add_argument("--drain-seconds", type=arg_types.real(0.0, 3600), default=10.0, metavar="SECONDS",
                   help="on SIGINT or SIGTERM, give running requests this long to finish, then cancel them "
                        "(a stream ends with an error chunk and [DONE]); a second signal cancels them at once "
                        "(default 10)")
