"""`lever serve-verifier`: host a target for edge clients (lever.remote.server)."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import LeverError
from ..extras import install_hint
from ..http.address import base_url, is_loopback
from . import arg_types
from .limits import MAX_IDLE_TTL_S, MAX_NEW_TOKENS, MAX_SESSIONS, MAX_TREE_NODES
from .options import (add_backend_options, add_cache_dir, add_compute_options, add_context, add_draft, add_draft_head,
                      add_dram_budget, add_keepalive_and_drain, add_no_progress, add_reader_options, add_server_address,
                      add_target_store)

VERIFY_GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256]
MIN_TOKEN_BYTES = 16
MAX_TOKEN_FILE_BYTES = 4096          # a token file holds one token: a few dozen bytes


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve-verifier", help="host a target model that verifies edge clients' drafts",
        description="Serve a target model over HTTP for `lever generate --remote URL`: clients draft "
                    "locally and send token trees; this server verifies them exactly (greedy or sampling) "
                    "and keeps each session's KV cache.")
    p.add_argument("--model", type=arg_types.name, required=True, metavar="NAME_OR_STORE",
                   help="registered model name, GGUF file, checkpoint dir, or a flash store (`lever convert`)")
    add_server_address(p, port=8000, token_help="(Authorization: Bearer ...)")
    p.add_argument("--tls-cert", default=None, metavar="PEM", help="serve HTTPS with this certificate chain "
                                                                   "(needs --tls-key)")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    p.add_argument("--max-sessions", type=arg_types.integer(1, MAX_SESSIONS), default=16, metavar="N", help="open sessions at most (default 16)")
    p.add_argument("--max-session-tokens", type=arg_types.integer(2, MAX_NEW_TOKENS), default=4096, metavar="N",
                   help="tokens per session at most: prompt, generated and a tree (default 4096)")
    p.add_argument("--max-tree-nodes", type=arg_types.integer(1, MAX_TREE_NODES + 1), default=256, metavar="N",
                   help="nodes per verified tree at most, root included (default 256)")
    p.add_argument("--idle-ttl", type=arg_types.real(1.0, MAX_IDLE_TTL_S), default=600.0, metavar="SECONDS",
                   help="close a session unused for this long (default 600)")
    p.add_argument("--max-body-bytes", type=arg_types.integer(1, 1 << 30), default=1 << 20, metavar="BYTES",
                   help="largest request body (default 1 MiB)")
    p.add_argument("--prefill-chunk", type=arg_types.integer(1, 1 << 16), default=128, metavar="TOKENS",
                   help="prompt tokens per prefill step; other sessions' rounds run between steps (default 128)")
    p.add_argument("--header-timeout", type=arg_types.real(0.01, 3600), default=10.0, metavar="SECONDS",
                   help="close a connection whose request headers are not complete this soon (default 10)")
    p.add_argument("--body-timeout", type=arg_types.real(0.01, 3600), default=30.0, metavar="SECONDS",
                   help="answer 408 to a request whose body is not complete this soon after its headers "
                        "(default 30)")
    p.add_argument("--max-connections", type=arg_types.integer(1, 1 << 20), default=256, metavar="N",
                   help="open connections at most; more get a 503 (default 256)")
    p.add_argument("--max-connections-per-ip", type=arg_types.integer(1, 1 << 20), default=64, metavar="N",
                   help="open connections at most from one address (default 64)")
    add_keepalive_and_drain(p)
    p.add_argument("--batch-window-ms", type=arg_types.real(0.0, 10_000.0), default=5.0, metavar="MS",
                   help="verify the rounds of different sessions that arrive within this many milliseconds (and "
                        "while a pass runs) in one target pass, each exactly as alone; 0 = one round per pass "
                        "(default 5)")
    p.add_argument("--max-batch-trees", type=arg_types.integer(1, MAX_SESSIONS), default=8, metavar="N",
                   help="session rounds per batched target pass at most (default 8)")
    add_dram_budget(p, "a flash-store target")
    add_compute_options(p)
    add_cache_dir(p)
    add_reader_options(p)
    for not_offered in (add_target_store, add_draft, add_draft_head, add_context, add_no_progress, add_backend_options):
        not_offered(p, offered=False)
    p.set_defaults(run=run)


def read_token(path: str) -> str:
    """The bearer token in the file at `path` (surrounding whitespace
    stripped): a regular file of at most MAX_TOKEN_FILE_BYTES bytes (a FIFO
    or device is refused unread: it would block, or never end)."""
    from ..files import read_small_file
    data = read_small_file(path, MAX_TOKEN_FILE_BYTES, f"--token-file {path}")
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise LeverError(f"--token-file {path}: the token must be printable ASCII") from None
    if not token or any(c.isspace() for c in token):
        raise LeverError(f"--token-file {path}: expected one token without spaces")
    if not token.isascii() or not token.isprintable():
        raise LeverError(f"--token-file {path}: the token must be printable ASCII")
    return token


def read_server_token(path: str) -> str:
    """The server's bearer token: as `read_token`, and refused when shorter
    than MIN_TOKEN_BYTES bytes or when the file is readable by its group or
    by others (POSIX permissions)."""
    token = read_token(path)
    if len(token) < MIN_TOKEN_BYTES:
        raise LeverError(f"--token-file {path}: the token has {len(token)} characters; use at least "
                         f"{MIN_TOKEN_BYTES} (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    mode = os.stat(path).st_mode
    if os.name == "posix" and mode & (stat.S_IRGRP | stat.S_IROTH):
        raise LeverError(f"--token-file {path}: readable by other users (mode {stat.S_IMODE(mode):o}); "
                         f"chmod 600 {path}")
    return token


def load_target(args):
    """(Run, name): a store streamed under --dram-budget or --memory-limit,
    else a model in DRAM.  Under --memory-limit the KV caches of
    --max-sessions full sessions are planned for (else one session's, at
    least MIN_KV_TOKENS), and a session's sampled tree keeps --max-tree-nodes
    logits rows."""
    from ..config import RunConfig
    from ..runtime import MIN_KV_TOKENS, build, kv_rule
    from ..store.manifest import MANIFEST
    path = Path(args.model)
    is_store = path.is_dir() and (path / MANIFEST).is_file()
    config = RunConfig.from_args(args, draft=None)
    if is_store:
        config = replace(config, target=replace(config.target, store=path))
    # one limit for the process: every session's KV cache is planned; a target-only budget: one session's
    if args.memory_limit:
        kv = kv_rule(new_tokens=args.max_session_tokens, prompt_tokens=0, sequences=args.max_sessions)
    else:
        kv = kv_rule(new_tokens=args.max_session_tokens, prompt_tokens=0, floor=MIN_KV_TOKENS)
    run = build(config, tree_rows=args.max_tree_nodes, sampling=True, kv=kv)
    return run, path.name if path.exists() else args.model


def measure_verify_cost(model, max_nodes: int, say) -> dict:
    """Seconds of one target pass over n tree tokens, for the clients' tree sizing:
    on the native layers a quick estimate (lever.cost.quick: a few flash reads
    and one layer's forwards per layer type, seconds rather than the minutes
    of whole passes over a streamed store), else timed whole passes.  The
    clients follow what rounds really cost (lever.remote.cost)."""
    import time

    from ..cost.measure import forward_seconds
    from ..cost.quick import estimate_pass_seconds, layer_groups, quick_supported
    grid = [n for n in VERIFY_GRID if n <= max_nodes]
    if not quick_supported(model):
        seconds = forward_seconds(model, grid, ctx=128, repeats=2, rng=np.random.default_rng(0), say=say,
                                  label="verify")
        return {"n": grid, "s": [round(s, 6) for s in seconds]}
    say(f"measuring the verify cost (flash reads, one layer's compute per layer type: {len(layer_groups(model))} "
        f"of {model.config.n_layers} layers) ...")
    t0 = time.perf_counter()
    seconds = estimate_pass_seconds(model, grid)
    say(f"verify cost estimated in {time.perf_counter() - t0:.1f} s: "
        + ", ".join(f"n={n} {s * 1e3:,.1f} ms" for n, s in zip(grid, seconds)))
    return {"n": grid, "s": [round(s, 6) for s in seconds]}


def batch_words(server) -> str:
    """'batching rounds within 5 ms, up to 8 per pass' or 'one round per pass'."""
    if server.batcher is None:
        return "one round per pass"
    return f"batching rounds within {server.batch_window_s * 1e3:g} ms, up to {server.max_batch_trees} per pass"


def run(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise LeverError(f"lever serve-verifier needs aiohttp: {install_hint('server')}") from None
    from ..remote.protocol import Limits
    from ..remote.server import serve_forever

    from ..remote.tls import server_context

    token = read_server_token(args.token_file) if args.token_file else None
    if token is None and not is_loopback(args.host):
        raise LeverError(f"refusing to serve on {args.host} without authentication: pass --token-file F "
                         f"(or bind 127.0.0.1)")
    if not 0 <= args.port < 65536:
        raise LeverError(f"--port must be in 0..65535, got {args.port}")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise LeverError("--tls-cert and --tls-key go together: pass both or neither")
    tls = server_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    if args.batch_window_ms > 0 and args.kernels == "torch":
        raise LeverError("--kernels torch cannot verify several sessions in one pass: pass --batch-window-ms 0")
    try:
        limits = Limits(max_sessions=args.max_sessions, max_session_tokens=args.max_session_tokens,
                        max_tree_nodes=args.max_tree_nodes, idle_ttl_s=args.idle_ttl,
                        max_body_bytes=args.max_body_bytes, prefill_chunk=args.prefill_chunk,
                        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                        max_connections=args.max_connections, max_connections_per_ip=args.max_connections_per_ip,
                        keepalive_timeout_s=args.keepalive_timeout)
    except ValueError as e:
        raise LeverError(str(e)) from None

    def say(line: str) -> None:
        print(f"lever serve-verifier: {line}", file=sys.stderr, flush=True)

    run, name = load_target(args)
    loaded, memory = run.loaded, run.memory
    if memory is not None:
        say(f"memory limit {memory.limit_bytes / 1e6:,.0f} MB: target budget {memory.store_budget_bytes / 1e6:,.0f} "
            f"MB, {args.max_sessions} sessions of {args.max_session_tokens} tokens planned")
    from ..remote.batcher import batching_unsupported
    reason = batching_unsupported(loaded.model) if args.batch_window_ms > 0 else None
    if reason is not None:
        raise LeverError(f"cannot batch verification: {reason}; pass --batch-window-ms 0")
    verify_cost = measure_verify_cost(loaded.model, limits.max_tree_nodes, say)
    server = run.verifier_server(name, limits, token=token, verify_cost=verify_cost,
                                 tokenizer=loaded.tokenizer.fingerprint(), log=say,
                                 batch_window_s=args.batch_window_ms / 1e3, max_batch_trees=args.max_batch_trees)

    def ready(port: int) -> None:
        say(f"serving {name} on {base_url('https' if tls else 'http', args.host, port)} (protocol v1, "
            f"{'bearer token' if token else 'no authentication, loopback only'}; up to {limits.max_sessions} "
            f"sessions of {server.session_capacity} tokens, trees of {limits.max_tree_nodes} nodes; "
            f"{batch_words(server)})")

    try:
        serve_forever(server, args.host, args.port, on_ready=ready, ssl_context=tls, drain_s=args.drain_seconds)
    except OSError as e:
        raise LeverError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}") from None
    return 0
