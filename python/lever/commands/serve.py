"""`lever serve`: an OpenAI-compatible server over one model (lever.serve).

The model, draft, mode and sampling options are `lever generate`'s; the
sampling options are the defaults of requests that do not set their own.
"""

from __future__ import annotations

import argparse
import sys

from ..api import DEFAULT_MODEL
from ..errors import LeverError
from . import arg_types
from .generate import check_mode, default_mode
from .limits import MAX_NEW_TOKENS
from .memory_limit import plan_memory
from .options import add_cache_dir, add_dram_budget, add_reader_options, add_sampling_options, add_spec_options

PROMPT_ALLOWANCE = 1024        # prompt tokens the KV plan allows beside --max-tokens (as `lever generate`)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve one model at /v1/chat/completions, /v1/completions, /v1/models, /health and /metrics "
                    "(OpenAI's request and response format, streaming included). Requests run one at a time "
                    "on one engine, first come first served; each answer carries a `speculative` object.")
    p.add_argument("--model", type=arg_types.name, default=DEFAULT_MODEL,
                   help=f"registered model name, GGUF file or checkpoint dir (default: {DEFAULT_MODEL})")
    p.add_argument("--model-name", type=arg_types.name, default=None, metavar="NAME",
                   help="the name clients use in requests and /v1/models lists (default: --model, or the "
                        "store's directory name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other "
                                                       "address needs --token-file)")
    p.add_argument("--port", type=arg_types.integer(0, 65535), default=8080, help="port (default 8080; 0: any free)")
    p.add_argument("--token-file", default=None, metavar="F",
                   help="file holding the bearer token clients must send (the OpenAI client's api_key): at least "
                        "16 printable ASCII characters, readable by its owner only (chmod 600)")
    p.add_argument("--max-queue", type=arg_types.integer(1, 1 << 20), default=16, metavar="N",
                   help="requests that may wait for the engine; one more is answered 429 (default 16)")
    p.add_argument("--max-tokens", type=arg_types.integer(1, MAX_NEW_TOKENS), default=4096, metavar="N",
                   help="completion tokens per request at most, and the default of a request without "
                        "max_tokens (capped by the context) (default 4096)")
    p.add_argument("--max-body-bytes", type=arg_types.integer(1, 1 << 30), default=1 << 20, metavar="BYTES",
                   help="largest request body (default 1 MiB)")
    p.add_argument("--header-timeout", type=arg_types.real(0.01, 3600), default=10.0, metavar="SECONDS",
                   help="close a connection whose request headers are not complete this soon (default 10)")
    p.add_argument("--body-timeout", type=arg_types.real(0.01, 3600), default=30.0, metavar="SECONDS",
                   help="answer 408 to a body not complete this soon after its headers (default 30)")
    p.add_argument("--max-connections", type=arg_types.integer(1, 1 << 20), default=256, metavar="N",
                   help="open connections at most; more get a 503 (default 256)")
    p.add_argument("--max-connections-per-ip", type=arg_types.integer(1, 1 << 20), default=64, metavar="N",
                   help="open connections at most from one address (default 64)")
    add_sampling_options(p, top=True, seed_default=None)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "bf16", "float32", "fp32"],
                   help="compute dtype (default bfloat16)")
    p.add_argument("--kernels", default="native", choices=["native", "torch"],
                   help="native: Lever's decoder and kernels (default); torch: the torch reference")
    add_cache_dir(p)
    flash = p.add_argument_group("flash-resident target")
    flash.add_argument("--target-store", type=arg_types.store_dir, default=None, metavar="DIR",
                       help="stream the target from this store (see `lever convert`) instead of --model")
    add_dram_budget(flash, "the target")
    add_reader_options(flash)
    spec = p.add_argument_group("speculative decoding")
    add_spec_options(spec, "ar: target alone; chain: k drafted tokens; tree: a static token tree; lever: a tree "
                           "sized per iteration from this device's profile, one calibration per sampling setting "
                           "(default: lever with a draft model and --target-store, tree with another --draft, "
                           "else ar)")
    spec.add_argument("--reprofile", action="store_true",
                      help="mode lever: measure the device profile again even if one is cached")
    spec.add_argument("--draft-ahead", action="store_true",
                      help="while the target verifies a tree, a draft model extends it along its own most likely "
                           "path (output unchanged)")
    p.set_defaults(run=run)


def build_specs(args: argparse.Namespace, mode: str, loaded):
    """(drafter, spec_for): the draft and the SpecConfig of each request's
    sampling (lever.serve.specs), built as `lever generate` builds them."""
    from ..api import make_drafter
    from ..draft.base import TreeShape
    from ..engine import SpecConfig
    from ..serve.specs import LeverSpecs, fixed_specs
    try:
        shape = TreeShape(args.tree_budget, args.tree_topk, args.tree_depth)
    except ValueError as e:
        raise LeverError(str(e)) from None
    drafter = make_drafter(args.draft, dtype=args.dtype, cache_dir=args.cache_dir,
                           kernels=args.kernels, head=args.draft_head) if args.draft else None
    base = SpecConfig("tree" if mode == "lever" else mode, args.draft_len, shape, draft_ahead=args.draft_ahead)
    if mode != "lever":
        return drafter, fixed_specs(base)

    def make_policy(params):
        from ..policy import lever_policy
        return lever_policy(loaded.model, drafter, target_id=loaded.path, kernels=args.kernels, reader=args.reader,
                            read_limit_bytes_per_s=args.read_limit if args.target_store else 0.0, dtype=args.dtype,
                            params=params, cache_dir=args.cache_dir, max_nodes=args.lever_max_nodes,
                            max_depth=args.lever_max_depth, topk=args.lever_topk,
                            force_profile=args.reprofile and not specs.policies,
                            tune_ring=bool(args.target_store) and args.prefetch_depth == "auto" and not specs.policies,
                            progress=not specs.policies, context_tokens=PROMPT_ALLOWANCE + args.max_tokens)

    specs = LeverSpecs(make_policy, base)
    return drafter, specs


def load_target(args: argparse.Namespace, mode: str):
    """(LoadedModel, memory plan): the store streamed under --dram-budget or
    --memory-limit, else the model in DRAM; one sequence's KV cache of
    --max-tokens plus a prompt allowance is planned."""
    from ..api import load, load_store, store_tokenizer
    from ..store.manifest import StoreManifest
    tree_rows = 1 + {"ar": 0, "chain": args.draft_len, "tree": args.tree_budget, "lever": args.lever_max_nodes}[mode]
    kv_tokens = max(2048, PROMPT_ALLOWANCE + args.max_tokens)
    if not args.target_store:
        memory = plan_memory(args, target_name=args.model, draft=args.draft, kv_tokens=kv_tokens,
                             tree_rows=tree_rows, sampling=True)
        return load(args.model, dtype=args.dtype, cache_dir=args.cache_dir, kernels=args.kernels), memory
    if args.kernels == "torch":
        raise LeverError("--kernels torch runs in-memory models only; a --target-store streams on the native decoder")
    kv_tokens = min(kv_tokens, StoreManifest.load(args.target_store).config.max_context)
    tokenizer = store_tokenizer(args.target_store, args.cache_dir)
    memory = plan_memory(args, target_store=args.target_store, draft=args.draft, kv_tokens=kv_tokens,
                         tree_rows=tree_rows, sampling=True)
    loaded = load_store(args.target_store, args.dram_budget, dtype=args.dtype, backend=args.reader,
                        prefetch_depth=args.prefetch_depth, cache_dir=args.cache_dir, kv_tokens=kv_tokens,
                        max_read_bytes_per_s=args.read_limit, tokenizer=tokenizer, queue_depth=args.read_queue_depth)
    return loaded, memory


def build_server(args: argparse.Namespace, say=lambda line: None):
    """The OpenAIServer of the command line (the model loaded), and the memory plan."""
    from pathlib import Path

    from ..sampling import SamplingParams
    from ..serve.app import OpenAIServer, ServeLimits
    from ..serve.generation import Generator
    from ..serve.prom import EngineCounters
    from .serve_verifier import read_server_token

    mode = args.mode or default_mode(args.draft, args.target_store)
    check_mode(mode, args.draft)
    token = read_server_token(args.token_file) if args.token_file else None
    try:
        limits = ServeLimits(max_queue=args.max_queue, max_tokens=args.max_tokens, max_body_bytes=args.max_body_bytes,
                             header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                             max_connections=args.max_connections,
                             max_connections_per_ip=args.max_connections_per_ip)
        defaults = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    except ValueError as e:
        raise LeverError(str(e)) from None
    loaded, memory = load_target(args, mode)
    drafter, spec_for = build_specs(args, mode, loaded)
    name = args.model_name or (Path(args.target_store).name if args.target_store else args.model)
    generator = Generator(loaded, drafter, spec_for, args.draft, EngineCounters())
    return OpenAIServer(generator, name, limits, token=token, defaults=defaults, log=say), memory


def run(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise LeverError("lever serve needs aiohttp: pip install 'lever[server]'") from None
    from ..serve.site import serve_forever
    from .serve_verifier import is_loopback

    if args.token_file is None and not is_loopback(args.host):
        raise LeverError(f"refusing to serve on {args.host} without authentication: pass --token-file F "
                         f"(or bind 127.0.0.1)")

    def say(line: str) -> None:
        print(f"lever serve: {line}", file=sys.stderr, flush=True)

    server, memory = build_server(args, say)
    if memory is not None:
        say(f"memory limit {memory.limit_bytes / 1e6:,.0f} MB: target budget {memory.store_budget_bytes / 1e6:,.0f} MB")
    gen = server.generator

    def ready(port: int) -> None:
        say(f"serving {server.model_name} at http://{args.host}:{port}/v1 (mode {gen.mode}"
            f"{f', draft {gen.draft}' if gen.draft else ''}; context {gen.context} tokens; queue "
            f"{server.limits.max_queue}; {'bearer token' if server.token else 'no authentication, loopback only'})")
        print(f"http://{args.host}:{port}/v1", flush=True)

    try:
        serve_forever(server, args.host, args.port, on_ready=ready)
    except OSError as e:
        raise LeverError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}") from None
    return 0
