"""`lever serve`: an OpenAI-compatible server over one model (lever.serve).

The model, draft, mode and sampling options are `lever generate`'s; the
sampling options are the defaults of requests that do not set their own.
"""

from __future__ import annotations

import argparse
import sys

from ..config import DEFAULT_MODEL, DecodeConfig, RunConfig
from ..engine import SpecConfig
from ..errors import LeverError
from ..extras import install_hint
from ..runtime import MIN_KV_TOKENS, PROMPT_ALLOWANCE, build, kv_rule
from . import arg_types
from .options import (add_backend_options, add_cache_dir, add_compute_options, add_context, add_dram_budget,
                      add_keepalive_and_drain, add_max_new_tokens, add_no_progress, add_reader_options, add_reprofile,
                      add_sampling_options, add_server_address, add_spec_options, add_target_store)

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
    add_server_address(p, port=8080, token_help="(the OpenAI client's api_key)")
    p.add_argument("--max-queue", type=arg_types.integer(1, 1 << 20), default=16, metavar="N",
                   help="requests that may wait for the engine; one more is answered 429 (default 16)")
    add_max_new_tokens(p, default=4096, old="--max-tokens",
                       help="completion tokens per request at most, and the default of a request without "
                            "max_tokens (capped by the context) (default 4096)")
    add_context(p)
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
    p.add_argument("--max-prefill-seconds", type=arg_types.real(0.01, 1e6), default=300.0, metavar="SECONDS",
                   help="stop a request whose prompt's prefill runs longer, answering 422 prefill_timeout "
                        "(default 300)")
    add_keepalive_and_drain(p)
    add_sampling_options(p, top=True, seed_default=None)
    add_compute_options(p)
    add_cache_dir(p)
    add_no_progress(p, offered=False)
    add_backend_options(p, offered=False)
    flash = p.add_argument_group("flash-resident target")
    add_target_store(flash)
    add_dram_budget(flash, "the target")
    add_reader_options(flash)
    spec = p.add_argument_group("speculative decoding")
    add_spec_options(spec, "ar: target alone; chain: k drafted tokens; tree: a static token tree; lever: a tree "
                           "sized per iteration from this device's profile, one calibration per sampling setting "
                           "(default: lever with a draft model and --target-store, tree with another --draft, "
                           "else ar)")
    add_reprofile(spec)
    spec.add_argument("--draft-ahead", action="store_true",
                      help="while the target verifies a tree, a draft model extends it along its own most likely "
                           "path (output unchanged)")
    p.set_defaults(run=run)


def build_specs(run, decode: DecodeConfig):
    """The SpecConfig of each request's sampling (lever.serve.specs), built as
    `lever generate` builds them: one mode lever policy per sampling setting."""
    from ..serve.specs import LeverSpecs, fixed_specs
    base = decode.spec(mode="tree" if decode.mode == "lever" else None)
    if decode.mode != "lever":
        return fixed_specs(base)

    def make_policy(params):
        return run.lever_policy(decode, params=params, first=not specs.policies,
                                context_tokens=PROMPT_ALLOWANCE + decode.max_new_tokens)

    specs = LeverSpecs(make_policy, base)
    return specs


def build_server(args: argparse.Namespace, say=lambda line: None):
    """The OpenAIServer of the command line (the model loaded), and the memory
    plan.  The KV cache holds one sequence of --max-new-tokens plus a prompt
    allowance (at least MIN_KV_TOKENS, at most a store's context)."""
    from ..serve.app import OpenAIServer, ServeLimits
    from ..serve.generation import Generator
    from ..serve.prom import EngineCounters
    from .serve_verifier import read_server_token

    config = RunConfig.from_args(args)
    decode = DecodeConfig.from_args(args, draft=args.draft, streamed=config.target.streamed,
                                    draft_ahead=args.draft_ahead, max_new_tokens=args.max_new_tokens)
    token = read_server_token(args.token_file) if args.token_file else None
    try:
        limits = ServeLimits(max_queue=args.max_queue, max_tokens=args.max_new_tokens,
                             max_body_bytes=args.max_body_bytes,
                             header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                             max_connections=args.max_connections,
                             max_connections_per_ip=args.max_connections_per_ip,
                             max_prefill_s=args.max_prefill_seconds,
                             keepalive_timeout_s=args.keepalive_timeout)
    except ValueError as e:
        raise LeverError(str(e)) from None
    run = build(config, tree_rows=decode.tree_rows, sampling=True,
                kv=kv_rule(new_tokens=decode.max_new_tokens, floor=MIN_KV_TOKENS))
    spec_for = build_specs(run, decode)
    name = args.model_name or (config.target.store.name if config.target.streamed else args.model)
    generator = Generator(run.loaded, run.drafter, spec_for, args.draft, EngineCounters(), run.speculate,
                          kv_limit=config.memory.context)
    return OpenAIServer(generator, name, limits, token=token, defaults=decode.sampling, log=say), run.memory


def run(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise LeverError(f"lever serve needs aiohttp: {install_hint('server')}") from None
    from ..http.address import base_url, is_loopback
    from ..serve.site import serve_forever

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
        url = base_url("http", args.host, port) + "/v1"
        say(f"serving {server.model_name} at {url} (mode {gen.mode}"
            f"{f', draft {gen.draft}' if gen.draft else ''}; context {gen.context} tokens; queue "
            f"{server.limits.max_queue}; {'bearer token' if server.token else 'no authentication, loopback only'})")
        print(url, flush=True)

    try:
        serve_forever(server, args.host, args.port, on_ready=ready, drain_s=args.drain_seconds)
    except OSError as e:
        raise LeverError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}") from None
    return 0
