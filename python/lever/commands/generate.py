"""`lever generate`: plain decoding with one model, streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys

from ..config import DEFAULT_MODEL, DecodeConfig, RemoteConfig, RunConfig
from ..engine import SpecConfig
from ..errors import LeverError
from ..runtime import MIN_KV_TOKENS, PROMPT_ALLOWANCE, build, kv_rule
from . import arg_types
from .limits import MAX_CALL_COST_MS, MAX_RETRY_DEADLINE_S
from .options import (add_backend_options, add_cache_dir, add_compute_options, add_context, add_dram_budget,
                      add_max_new_tokens, add_probes, add_reader_options, add_reprofile, add_sampling_options,
                      add_no_progress, add_spec_options, add_target_store)
from ..memory.run_plan import memory_report
from .memory_limit import print_memory_line
from .prompt_input import add_prompt_options, read_prompt


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text from a prompt",
                              description="Generate a completion; text streams to stdout.")
    p.add_argument("--model", type=arg_types.name, default=DEFAULT_MODEL,
                   help=f"registered model name (see `lever models`), GGUF file or checkpoint dir "
                        f"(default: {DEFAULT_MODEL})")
    add_prompt_options(p)
    add_max_new_tokens(p, default=128, lo=0, help="tokens to generate at most (default 128)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly --max-new-tokens tokens (do not stop at end-of-sequence)")
    add_context(p)
    add_sampling_options(p, top=True, seed_default=None)
    add_compute_options(p)
    p.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template")
    add_cache_dir(p)
    add_no_progress(p, offered=False)
    flash = p.add_argument_group("flash-resident target")
    add_target_store(flash)
    add_dram_budget(flash, "the target")
    spec = p.add_argument_group("speculative decoding")
    add_spec_options(spec, "ar: target alone; chain: k drafted tokens; tree: a static token "
                           "tree; lever: a tree sized per iteration by expected tokens per second from this "
                           "device's profile (default: lever with a draft model and --target-store, tree with "
                           "another --draft, else ar)")
    ahead = spec.add_mutually_exclusive_group()
    ahead.add_argument("--draft-ahead", action="store_true",
                       help="while the target verifies a tree, a draft model extends it along its own most "
                            "likely path; the next tree reuses that when the target accepts it (output unchanged; "
                            "the default with a draft model on --backend cpu-static|qnn)")
    ahead.add_argument("--no-draft-ahead", action="store_true",
                       help="do not draft ahead, also on a static-shape backend")
    add_probes(spec, default="auto",
               help="early-exit pruning of the target's tree passes with the probe trained for it "
                    "(`lever probe train`): on, off, or auto = on when a probe exists and its training "
                    "found it worth running (default auto)")
    add_reprofile(spec)
    add_reader_options(flash)
    remote = p.add_argument_group("edge-cloud: the target on a verifier server (`lever serve-verifier`)")
    remote.add_argument("--remote", type=arg_types.url, default=None, metavar="URL",
                        help="verify on the server at URL (http://HOST:PORT or https://HOST:PORT); --draft drafts and tokenizes here "
                             "(default mode lever; --mode ar is target-only remote decoding)")
    remote.add_argument("--remote-engine", choices=("lever", "vllm"), default="lever",
                        help="what serves --remote: lever (`lever serve-verifier`, default) or vllm (an unmodified "
                             "vLLM OpenAI-compatible server; greedy, or --temperature 1 with top-p 1 and top-k 0)")
    remote.add_argument("--remote-model", type=arg_types.name, default=None, metavar="NAME",
                        help="--remote-engine vllm: the served model's name (default: the only one it serves)")
    remote.add_argument("--vllm-branches", type=arg_types.integer(1, 16), default=1, metavar="N",
                        help="--remote-engine vllm, greedy: send the tree's N best paths as N prompts of one "
                             "request (default 1: its best path)")
    remote.add_argument("--token-file", type=arg_types.name, default=None, metavar="F",
                        help="file holding the server's bearer token")
    remote.add_argument("--tls-ca", type=arg_types.name, default=None, metavar="PEM",
                        help="an https:// server's certificate (or its CA) in PEM, for a server whose "
                             "certificate the system does not trust (e.g. self-signed)")
    remote.add_argument("--timeout", type=arg_types.real(1.0, MAX_RETRY_DEADLINE_S), default=120.0,
                        metavar="SECONDS", help="the longest one HTTP exchange with the server may take "
                                                "(default 120)")
    remote.add_argument("--call-cost-ms", type=arg_types.real(0.0, MAX_CALL_COST_MS), default=0.0, metavar="MS",
                        help="mode lever: count each target call as this many extra milliseconds when sizing "
                             "trees, trading speed for fewer server calls (default 0: fastest)")
    remote.add_argument("--retry-deadline", type=arg_types.real(0.0, MAX_RETRY_DEADLINE_S), default=30.0,
                        metavar="SECONDS",
                        help="keep retrying an unanswered request this long, then stop with what was "
                             "generated (default 30)")
    flash.add_argument("--drop-caches", action="store_true",
                       help="drop the OS page cache before the run (needs root; the result is reported)")
    add_backend_options(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object at the end (token ids, text, timing) instead of streaming")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """parse -> config -> build -> generate -> report."""
    from .static_backend import check_backend_args, draft_ahead_default
    checks = check_backend_args(args, kernels=args.kernels, remote=args.remote, probes=args.probes)
    prompt = read_prompt(args)
    if args.remote:
        return run_remote(args, prompt)
    if args.remote_engine != "lever" or args.remote_model or args.vllm_branches != 1:
        raise LeverError("--remote-engine, --remote-model and --vllm-branches need --remote URL")
    config = RunConfig.from_args(args)
    decode = DecodeConfig.from_args(args, draft=args.draft, streamed=config.target.streamed, probes=checks.probes,
                                    draft_ahead=args.draft_ahead or draft_ahead_default(args, args.draft),
                                    chat=not args.no_chat, ignore_eos=args.ignore_eos)
    if checks.npu_profile and decode.mode != "lever":
        raise LeverError(f"--npu-profile sizes the trees of mode lever; this run's mode is {decode.mode}")
    run = build(config, tree_rows=decode.tree_rows, sampling=not decode.sampling.greedy,
                kv=kv_rule(new_tokens=max(0, decode.max_new_tokens), floor=MIN_KV_TOKENS,
                           in_memory=decode.max_new_tokens + PROMPT_ALLOWANCE),
                drop_caches=args.drop_caches)
    layers = run.layers                               # None on the native backend
    spec = speculation(run, decode, prompt, checks.npu_profile) if args.draft or decode.mode != "ar" else None
    completion = run.generate(prompt, decode, spec=spec, on_text=None if args.json else stream)
    run.save_calibrations()
    if args.json:
        print(json.dumps(json_report(args, run, decode, spec, completion, layers)))
    else:
        sys.stdout.write("\n")
        print_footer(args, run, spec, completion, layers)
    return 0


def stream(text: str) -> None:
    """Write generated text to stdout as it comes."""
    sys.stdout.write(text)
    sys.stdout.flush()


def speculation(run, decode: DecodeConfig, prompt: str, npu_profile) -> SpecConfig:
    """The SpecConfig of `decode` for this run: its probe pruner and, in mode
    lever, the gain-cost policy sized for this prompt's context."""
    pruner = run.pruner(decode.probes if decode.mode != "ar" else "off")
    policy = None
    if decode.mode == "lever":
        context = len(run.loaded.prompt_ids(prompt, chat=decode.chat)) + decode.max_new_tokens
        policy = run.lever_policy(decode, context_tokens=context, pruner=pruner, npu_profile=npu_profile)
    return decode.spec(policy=policy, pruner=pruner)


def json_report(args, run, decode: DecodeConfig, spec: SpecConfig | None, completion, layers) -> dict:
    """The --json object: the completion, and what ran (model, mode, kernels, flash, memory, probes, backend)."""
    from .static_backend import backend_json
    target, loaded = run.config.target, run.loaded
    pruner, policy = (spec.pruner, spec.policy) if spec is not None else (None, None)
    out = completion.to_json()
    out.update(model=target.name, path=str(loaded.path), dtype=target.dtype, mode=decode.mode, draft=args.draft,
               kernels=kernel_info(target.kernels, loaded.model, run.drafter))
    if target.streamed:
        out["flash"] = flash_stats(loaded.model.report(), len(completion.token_ids), run.page_cache)
    out["memory"] = memory_report(run.memory)
    out["probes"] = pruner.stats.to_json() if pruner is not None else None
    out["backend"] = backend_json(args, layers)
    if policy is not None and policy.npu_profile is not None:
        out["npu_profile"] = policy.npu_profile
    return out


def print_footer(args, run, spec: SpecConfig | None, completion, layers) -> None:
    """The bracketed lines on stderr after streamed text: tokens, speed, stop
    reason and seed; mode lever's trees; probes; backend; overlap; memory."""
    from .static_backend import backend_json, backend_line, overlap_line
    r = completion.result
    seed = f", seed {r.seed}" if r.seed is not None else ""
    print(f"[{len(r.token_ids)} tokens, prefill {r.prefill_s:.2f} s, "
          f"decode {r.decode_tokens_per_s:.1f} tokens/s, stop: {r.stop_reason}{seed}]", file=sys.stderr)
    stats = completion.spec
    if stats is not None and stats.policy and stats.policy.get("iterations"):
        lv = stats.policy
        print(f"[lever: {lv['iterations']} iterations, tree {lv['tree_size']['mean']:.1f} nodes on average "
              f"(max {lv['tree_size']['max']}), accepted length predicted "
              f"{lv['accepted_length']['predicted_mean']:.2f} / realised {lv['accepted_length']['realised_mean']:.2f}]",
              file=sys.stderr)
    pruner = spec.pruner if spec is not None else None
    if pruner is not None:
        ps = pruner.stats.to_json()
        print(f"[probes: layer {pruner.probe.layer}, {ps['pruned_per_pass']:.1f} draft nodes pruned per pass, "
              f"{100 * ps['compute_saved']:.1f}% of layer rows skipped, online recall "
              f"{ps['online_recall'] if ps['online_recall'] is not None else 'n/a'}]", file=sys.stderr)
    if layers is not None:
        print(backend_line(backend_json(args, layers), prefix="["), end="]\n", file=sys.stderr)
    if stats is not None and stats.iterations and (layers is not None or spec.draft_ahead):
        print(overlap_line(stats.overlap(), prefix="["), end="]\n", file=sys.stderr)
    print_memory_line(run.memory, sys.stderr)


def run_remote(args: argparse.Namespace, prompt: str) -> int:
    """Draft here, verify on the server at --remote."""
    from ..edge import RemoteTarget
    from .serve_verifier import read_token

    if not args.draft or args.draft == "ngram":
        raise LeverError("--remote needs --draft NAME: a draft model that drafts and tokenizes on this device")
    if args.target_store:
        raise LeverError("--remote and --target-store both name a target; choose one")
    if args.probes == "on":
        raise LeverError("--probes on prunes a target in this process; with --remote the server verifies "
                         "(run it with --probes off or auto)")
    remote = RemoteConfig.from_args(args, token=read_token(args.token_file) if args.token_file else None)
    decode = DecodeConfig.from_args(args, draft=args.draft, streamed=True,   # default mode: lever
                                    draft_ahead=args.draft_ahead, probes=args.probes, chat=not args.no_chat,
                                    ignore_eos=args.ignore_eos)
    target = RemoteTarget.from_config(remote, decode, args.draft, cache_dir=args.cache_dir)
    p = decode.sampling
    try:
        completion = target.generate(prompt, max_new_tokens=decode.max_new_tokens, temperature=p.temperature,
                                     top_p=p.top_p, top_k=p.top_k, seed=p.seed, chat=decode.chat,
                                     ignore_eos=decode.ignore_eos, on_text=None if args.json else stream)
    except LeverError as e:
        keep_partial(args, e, decode.mode)
        raise
    if args.json:
        out = completion.to_json()
        out.update(model=f"{args.remote} ({target.info.get('model')})", mode=decode.mode, draft=args.draft,
                   remote_engine=args.remote_engine)
        print(json.dumps(out))
    else:
        sys.stdout.write("\n")
        r, rm = completion.result, completion.remote
        seed = f", seed {r.seed}" if r.seed is not None else ""
        print(f"[{len(r.token_ids)} tokens, decode {r.decode_tokens_per_s:.1f} tokens/s, {rm['target_calls']} target "
              f"calls ({rm['target_calls_per_token']:.3f} per token), round trip {rm['round_trip_ms']['mean']:.1f} ms "
              f"on average, {rm['retries']} retries, {rm['rebuilds']} session rebuilds{seed}]" if rm["round_trip_ms"]
              else f"[{len(r.token_ids)} tokens{seed}]", file=sys.stderr)
    return 0


def keep_partial(args, error: LeverError, mode: str) -> None:
    """After a remote failure: the tokens generated before it stay on stdout (or in the --json object)."""
    partial = getattr(error, "partial_result", None)
    if partial is None:
        return
    if args.json:
        print(json.dumps({"error": str(error), "token_ids": partial.token_ids, "text": error.partial_text,
                          "new_tokens": len(partial.token_ids), "remote": error.remote, "mode": mode}))
    else:
        sys.stdout.write("\n")
    print(f"lever: the {len(partial.token_ids)} tokens generated before the failure are kept above",
          file=sys.stderr)


def kernel_info(mode: str, model, drafter=None) -> dict:
    """Which matmul path ran, on which instruction set, and the weight bytes held in DRAM."""
    from .. import _native
    info = {"mode": mode, "isa": _native.kernel_isa(), "threads": _native.get_num_threads()}
    resident = getattr(model, "resident_weight_bytes", None)          # a model in DRAM (not a streamed store)
    if resident is not None:
        info["resident_weight_bytes"] = resident
    draft_resident = getattr(getattr(drafter, "model", None), "resident_weight_bytes", None)
    if draft_resident is not None:
        info["draft_resident_weight_bytes"] = draft_resident
    return info


def flash_stats(report: dict, new_tokens: int, page_cache: str | None) -> dict:
    """The streamed target's run statistics, with per-token figures (bytes, seconds)."""
    per_token = report["passes"] and report["bytes_read"] / max(1, new_tokens)
    return {**report, "bytes_read_per_token": per_token, "page_cache": page_cache or "not dropped"}
