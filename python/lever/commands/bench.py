"""`lever bench`: every decoding mode over the same fixed prompts, in one process.

The target (a flash store streamed under a DRAM budget, or an in-memory
model) and the drafter are loaded once.  For each prompt every mode runs in
turn (ar, chain:K, tree:N, ... and optionally the memory-resident target), so
that machine noise spreads evenly over the modes.  Per mode it reports
decode tokens/s, the ratio to ar, the mean accepted length (tokens emitted
per target pass), bytes read from flash per token, the time split (draft /
verify compute / I/O stall / accept) and the mean draft tree size; at
temperature 0 it checks that every mode produced exactly ar's tokens.
Output: a table on stdout, a JSON file and a PNG bar chart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import LeverError, StoreError
from . import arg_types
from .limits import MAX_BENCH_PROMPTS, MAX_DRAFT_LEN, MAX_NEW_TOKENS, MAX_TREE_DEPTH, MAX_TREE_NODES, MAX_TREE_TOPK
from .options import add_cache_dir, add_dram_budget, add_reader_options, add_sampling_options, add_target_choice

QUICK = dict(prompts=2, new_tokens=16, modes=["ar", "chain:4", "tree:16"])
FULL = dict(prompts=10, new_tokens=64, modes=["ar", "chain:4", "chain:6", "chain:8", "tree:16", "tree:32", "tree:64"])
TREE_TOPK, TREE_DEPTH = 4, 8
RESIDENT = "resident"
MODE_HELP = "ar | chain:K | tree:N[:TOPK:DEPTH] | lever[:N]"
LEVER = "lever"


# -- mode specs ------------------------------------------------------------------

@dataclass(frozen=True)
class BenchMode:
    """One benchmarked decoding mode: its label ('tree:32') and engine configuration."""

    label: str
    spec: object                     # lever.engine.SpecConfig (mode lever: set once the policy is built)
    lever_nodes: int = 0             # mode lever: draft nodes per tree at most

    @property
    def max_draft(self) -> int:
        """Draft tokens per iteration at most (the engine's cache headroom)."""
        return self.lever_nodes if self.lever_nodes else self.spec.max_tree_nodes


def parse_mode(text: str) -> BenchMode:
    """'ar', 'chain:K', 'tree:N' (node budget N, topk 4, depth 8), 'tree:N:TOPK:DEPTH',
    or 'lever' / 'lever:N' (the gain-cost policy, at most N draft nodes, default 255);
    each number within the limits of lever.commands.limits."""
    from ..draft.base import TreeShape
    from ..engine import SpecConfig

    parts = text.strip().lower().split(":")
    bad = LeverError(f"bad mode spec {text!r}: expected {MODE_HELP} with positive integers "
                     f"(e.g. ar, chain:4, tree:32, tree:32:4:8)")
    kind, nums = parts[0], parts[1:]
    try:
        values = [int(v) for v in nums if len(v) <= 16]
    except ValueError:
        raise bad from None
    if len(values) < len(nums) or any(v < 1 for v in values):
        raise bad
    if kind == "ar" and not values:
        return BenchMode("ar", SpecConfig("ar"))
    if kind == LEVER and len(values) <= 1:
        from ..policy import DEFAULT_MAX_NODES
        nodes = values[0] if values else DEFAULT_MAX_NODES
        _check_limits(text, [("draft nodes", nodes, MAX_TREE_NODES)])
        return BenchMode(LEVER if not values else f"{LEVER}:{nodes}", None, lever_nodes=nodes)
    if kind == "chain" and len(values) == 1:
        _check_limits(text, [("chain length", values[0], MAX_DRAFT_LEN)])
        return BenchMode(f"chain:{values[0]}", SpecConfig("chain", draft_len=values[0]))
    if kind == "tree" and len(values) in (1, 3):
        budget, topk, depth = (values + [TREE_TOPK, TREE_DEPTH])[:3]
        _check_limits(text, [("tree nodes", budget, MAX_TREE_NODES), ("topk", topk, MAX_TREE_TOPK),
                             ("depth", depth, MAX_TREE_DEPTH)])
        label = f"tree:{budget}" if (topk, depth) == (TREE_TOPK, TREE_DEPTH) else f"tree:{budget}:{topk}:{depth}"
        return BenchMode(label, SpecConfig("tree", tree=TreeShape(budget, topk, depth)))
    raise bad


def _check_limits(text: str, values: list[tuple[str, int, int]]) -> None:
    """LeverError naming the first (what, value, limit) whose value exceeds its limit."""
    for what, value, limit in values:
        if value > limit:
            raise LeverError(f"bad mode spec {text!r}: {what} at most {limit}, got {value}")


def parse_modes(texts: list[str]) -> tuple[list[BenchMode], bool]:
    """Modes in the order given, duplicates dropped; ar first-class and always present
    (it is the reference). Returns (modes, whether ar was added)."""
    modes, seen = [], set()
    for text in texts:
        for piece in text.replace(",", " ").split():
            m = parse_mode(piece)
            if m.label not in seen:
                seen.add(m.label)
                modes.append(m)
    if not modes:
        raise LeverError(f"--modes is empty (expected {MODE_HELP})")
    added = "ar" not in seen
    if added:
        modes.insert(0, parse_mode("ar"))
    return modes, added


# -- the command -----------------------------------------------------------------

def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark decoding modes over a fixed prompt set",
        description="Run ar, chain and tree speculative decoding over the same fixed prompts (one process, "
                    "modes interleaved per prompt); print a table and write JSON and a PNG chart.")
    add_target_choice(p)
    p.add_argument("--draft", type=arg_types.name, default="ngram", metavar="NAME",
                   help="draft model kept in DRAM (registered name or path), or 'ngram' (default)")
    add_dram_budget(p)
    p.add_argument("--modes", nargs="+", default=None, metavar="MODE",
                   help=f"modes to compare, each {MODE_HELP}; tree:N = node budget N, topk {TREE_TOPK}, "
                        f"depth {TREE_DEPTH}; lever = the gain-cost policy (default: {' '.join(FULL['modes'])}, "
                        f"plus lever with a draft model; ar is always included)")
    p.add_argument("--prompts", type=arg_types.integer(1, MAX_BENCH_PROMPTS), default=None, metavar="N",
                   help=f"first N prompts of the set (default {FULL['prompts']})")
    p.add_argument("--prompt-set", type=arg_types.name, default="v1", metavar="VERSION",
                   help="prompt set version (default v1)")
    p.add_argument("--categories", type=arg_types.name, nargs="+", default=None, metavar="CAT",
                   help="only prompts of these categories (code, math, prose)")
    p.add_argument("--new-tokens", type=arg_types.integer(1, MAX_NEW_TOKENS), default=None, metavar="N",
                   help=f"tokens generated per prompt (default {FULL['new_tokens']})")
    add_sampling_options(p, top=False, seed_default=0)    # temperature 0: modes are checked against ar
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "bf16", "float32", "fp32"])
    p.add_argument("--kernels", default="native", choices=["native", "torch"],
                   help="native: the native decoder, quantised matrices stay quantised and Lever's kernels "
                        "multiply them (default); torch: the torch reference, weights dequantised to --dtype, "
                        "torch matmul (needs lever[torch])")
    add_reader_options(p)
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the OS page cache once before the first timed run (needs root; reported)")
    p.add_argument("--resident", action="store_true",
                   help="also measure the memory-resident target in ar mode (the store fully loaded), "
                        "the reference for the flash gap")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: {QUICK['prompts']} prompts, {QUICK['new_tokens']} tokens, modes "
                        f"{' '.join(QUICK['modes'])} (explicit options still win)")
    p.add_argument("--out", type=arg_types.directory, default=None, metavar="DIR",
                   help="where to write NAME.json and NAME.png (default bench/results in a Lever checkout, "
                        "else ./lever-bench-results)")
    p.add_argument("--name", type=arg_types.file_stem, default="bench",
                   help="file name stem of the outputs (default bench)")
    add_cache_dir(p)
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly --new-tokens tokens per prompt (do not stop at end-of-sequence)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def default_out_dir() -> Path:
    here = Path.cwd()
    if (here / "bench" / "make_prompts.py").is_file():      # a Lever source checkout
        return here / "bench" / "results"
    return here / "lever-bench-results"


def run(args: argparse.Namespace) -> int:
    cleanup: list = []
    try:
        return _run(args, cleanup)
    finally:
        for close in cleanup:
            close()


def _run(args: argparse.Namespace, cleanup: list) -> int:
    from ..api import DEFAULT_MODEL, LoadedModel, load, load_store, make_drafter, store_tokenizer
    from ..bench_prompts import load_prompts
    from ..engine import SpecConfig
    from ..sampling import SamplingParams
    from ..store.flash_reader import drop_page_cache
    from ..store.manifest import StoreManifest

    preset = QUICK if args.quick else FULL
    n_prompts = args.prompts if args.prompts is not None else preset["prompts"]
    new_tokens = args.new_tokens if args.new_tokens is not None else preset["new_tokens"]
    default_modes = preset["modes"] + ([LEVER] if args.draft != "ngram" else [])   # lever needs a draft model
    modes, ar_added = parse_modes(args.modes if args.modes is not None else default_modes)
    if args.draft == "ngram" and any(m.lever_nodes for m in modes):
        raise LeverError("mode lever needs a draft model (--draft NAME); prompt lookup ('ngram') has "
                         "no draft probabilities to calibrate")
    try:
        params = SamplingParams(temperature=args.temperature, seed=args.seed)
    except ValueError as e:
        raise LeverError(str(e)) from None
    greedy = params.greedy
    prompts = load_prompts(args.prompt_set, args.categories, n_prompts)
    out_dir = Path(args.out) if args.out else default_out_dir()
    needs_draft = any(m.lever_nodes or m.spec.mode != "ar" for m in modes)
    max_draft = max(m.max_draft for m in modes) + 2    # the engine's cache headroom

    # -- load the target (and the resident reference), then the drafter
    t0 = time.perf_counter()
    store = None
    if args.target_store:
        store = Path(args.target_store)
        try:
            manifest = StoreManifest.load(store)
        except StoreError as e:
            raise StoreError(f"--target-store: {e} (make one with `lever convert MODEL --out DIR`)") from None
        budget = args.dram_budget
        tok = store_tokenizer(store, args.cache_dir)
        ids = [tok.encode(tok.format_prompt(p["text"], chat=True)) for p in prompts]
        # what the longest run needs, at most the context (a longer run is refused by the context check)
        kv_tokens = min(manifest.config.max_context, max(map(len, ids)) + new_tokens + max_draft + 2)
        loaded = load_store(store, budget, dtype=args.dtype, backend=args.reader,
                            quantized=args.kernels == "native",
                            prefetch_depth=args.prefetch_depth, kv_tokens=kv_tokens, cache_dir=args.cache_dir,
                            max_read_bytes_per_s=args.read_limit)
        target_name = str(store)
    else:
        manifest, budget = None, None
        target_name = args.target or DEFAULT_MODEL
        loaded: LoadedModel = load(target_name, dtype=args.dtype, cache_dir=args.cache_dir, progress=True,
                                   kernels=args.kernels)
        ids = [loaded.prompt_ids(p["text"]) for p in prompts]
    target = loaded.model
    streamed = hasattr(target, "reset_stats")
    if streamed:
        cleanup.append(target.close)          # the reader's threads and file descriptors
    load_s = time.perf_counter() - t0
    resident = None
    if args.resident and streamed:
        from ..model.torch_reference import TorchModel, torch_dtype
        dtype = torch_dtype(args.dtype, "lever bench --resident (the store loaded as the torch reference)")
        from ..store.torch_reference import load_store_model
        resident = TorchModel(load_store_model(store, dtype, backend=args.reader,
                                               quantized=args.kernels == "native"))
    drafter = (make_drafter(args.draft, dtype=args.dtype, cache_dir=args.cache_dir,
                            kernels=args.kernels) if needs_draft else None)
    stop_ids = frozenset() if args.ignore_eos else loaded.tokenizer.eos_token_ids
    policies = []
    for i, m in enumerate(modes):
        if m.lever_nodes:
            from ..policy import lever_policy
            policy = lever_policy(target, drafter, target_id=loaded.path, kernels=args.kernels, reader=args.reader,
                                  read_limit_bytes_per_s=args.read_limit if streamed else 0.0,
                                  dram_budget=budget, dtype=args.dtype, params=params, cache_dir=args.cache_dir,
                                  max_nodes=m.lever_nodes, progress=not args.no_progress)
            policies.append(policy)
            modes[i] = BenchMode(m.label, SpecConfig(LEVER, policy=policy), m.lever_nodes)
    calibration_start = [p.calibration.observations for p in policies]

    # -- warm up (allocations, the read ring, the drafter), then start cold
    warm_mode = next((m for m in modes if m.spec.mode != "ar"), modes[0])
    from ..engine import speculative_generate
    warm_spec = warm_mode.spec if warm_mode.spec.mode != LEVER else SpecConfig("tree")   # lever learns from runs
    speculative_generate(target, drafter if warm_mode.spec.mode != "ar" else None, ids[0], 2, params,
                         warm_spec, stop_ids=stop_ids)
    if resident is not None:
        speculative_generate(resident, None, ids[0], 2, params, SpecConfig("ar"), stop_ids=stop_ids)
    page_cache = drop_page_cache() if args.drop_caches else "not dropped"
    raw_read_bps = None                   # the I/O lower bound's denominator (bytes/s)
    if streamed:
        from ..store.bandwidth import sequential_read
        raw_read_bps, _ = sequential_read(store, args.reader, args.read_limit)
        target.reset_stats()

    reader_info = target.report()["reader"] if streamed else None
    from .generate import kernel_info
    kernels = kernel_info(args.kernels, target, drafter)
    header = (f"# lever bench: target={target_name}"
              + (f" ({manifest.storage}, {manifest.weights_bytes / 1e6:,.0f} MB; budget {budget / 1e6:,.0f} MB, "
                 f"{target.plan.pinned_layers}/{manifest.config.n_layers} layers pinned, "
                 f"{target.plan.streamed_bytes_per_pass / 1e6:,.1f} MB streamed per pass; "
                 f"reader {reader_info['backend']} direct={reader_info['direct']})" if streamed else " (in memory)")
              + f" draft={args.draft if needs_draft else '-'} dtype={args.dtype}"
              + f" kernels={kernels['mode']} ({kernels['isa']}"
              + (f"; draft weights {kernels['draft_resident_weight_bytes'] / 2**20:,.0f} MiB in DRAM"
                 if "draft_resident_weight_bytes" in kernels else "") + ")")
    cats = {c: sum(p["category"] == c for p in prompts) for c in dict.fromkeys(p["category"] for p in prompts)}
    print(header, flush=True)
    print(f"# prompts: {len(prompts)} of set {args.prompt_set} ("
          + ", ".join(f"{c} {n}" for c, n in cats.items()) + f"), {new_tokens} new tokens, temperature "
          f"{args.temperature:g}; modes: {' '.join(m.label for m in modes)}"
          + (" (ar added as the reference)" if ar_added else "")
          + (f" + {RESIDENT}" if args.resident else ""), flush=True)
    print(f"# page cache: {page_cache}", flush=True)
    if raw_read_bps:
        print(f"# raw sequential read of the store: {raw_read_bps / 2**30:.2f} GiB/s; the I/O bound of a mode is "
              f"its bytes read per token at that rate (column I/O tok/s: the most tokens/s the flash allows)",
              flush=True)

    # -- the timed runs: for each prompt, every mode
    runs: list[tuple[str, object, object]] = [(m.label, target, m) for m in modes]
    if resident is not None:
        runs.append((RESIDENT, resident, parse_mode("ar")))
    rows: list[dict] = []
    raw: dict[str, list] = {label: [] for label, _, _ in runs}
    from tqdm import tqdm
    bar = tqdm(total=len(prompts) * len(runs), desc="lever bench", unit="run", file=sys.stderr,
               disable=args.no_progress, dynamic_ncols=True)
    t_bench = time.perf_counter()
    try:
        for p, prompt_ids in zip(prompts, ids):
            for label, model, m in runs:
                bar.set_postfix_str(f"{p['id']} {label}")
                if streamed:
                    target.reset_stats()
                result, stats = speculative_generate(model, drafter if m.spec.mode != "ar" else None, prompt_ids,
                                                     new_tokens, params, m.spec, stop_ids=stop_ids)
                n = len(result.token_ids)
                row = {"prompt_id": p["id"], "category": p["category"], "mode": label,
                       "prompt_tokens": len(prompt_ids), "new_tokens": n, "stop_reason": result.stop_reason,
                       "prefill_s": round(result.prefill_s, 4), "decode_s": round(result.decode_s, 4),
                       "tokens_per_s": round(n / result.decode_s, 3) if result.decode_s else None,
                       **stats.to_json(n), "token_ids": result.token_ids}
                if streamed and model is target:
                    rep = target.report()
                    row["flash_run"] = {k: rep[k] for k in ("passes", "bytes_read", "io_busy_s", "stall_s",
                                                            "dequant_s", "compute_s")}
                rows.append(row)
                raw[label].append((p, prompt_ids, result, stats))
                bar.update(1)
    finally:
        bar.close()
    bench_s = time.perf_counter() - t_bench

    # -- token-for-token check against ar, with a near-tie diagnosis (sampling is
    # keyed by position, so sampled runs of one seed must equal ar's too)
    ar_tokens = {p["id"]: r.token_ids for p, _, r, _ in raw["ar"]}
    checks: dict[str, list[dict]] = {}
    for label, model, _ in runs:
        if label == "ar":
            continue
        checks[label] = []
        for (p, prompt_ids, r, _), row in zip(raw[label], [x for x in rows if x["mode"] == label]):
            ref = ar_tokens[p["id"]]
            row["matches_ar"] = r.token_ids == ref
            if r.token_ids != ref:
                row["divergence"] = divergence(target, prompt_ids, ref, r.token_ids, params)
                checks[label].append(row["divergence"])

    aggregates = {label: aggregate(label, raw[label], checks.get(label), label == "ar") for label, _, _ in runs}
    ar_tps = aggregates["ar"]["tokens_per_s"]
    for a in aggregates.values():
        a["ratio_vs_ar"] = round(a["tokens_per_s"] / ar_tps, 4) if ar_tps else None
        per_token = a["bytes_read_per_token"]
        a["io_lower_bound_s_per_token"] = per_token / raw_read_bps if raw_read_bps and per_token else None
        a["io_bound_tokens_per_s"] = round(raw_read_bps / per_token, 2) if raw_read_bps and per_token else None
    for m in modes:
        aggregates[m.label]["spec"] = {"mode": m.spec.mode, "draft_len": m.spec.draft_len if m.spec.mode == "chain"
                                       else None, "tree": ({"budget": m.spec.tree.budget, "topk": m.spec.tree.topk,
                                                            "depth": m.spec.tree.depth}
                                                           if m.spec.mode == "tree" else None)}
        if m.spec.mode == LEVER:
            pol = m.spec.policy
            aggregates[m.label]["spec"]["lever"] = {"max_nodes": pol.max_nodes, "max_depth": pol.max_depth,
                                                    "topk": pol.topk}
            aggregates[m.label]["lever"] = {**pol.report(), "calibration_observations_at_start":
                                            calibration_start[policies.index(pol)],
                                            "io_share_n1": round(pol.cost.io_share(1), 4),
                                            "profile_pass_s": pol.cost.summary()["pass_s"]}
    resident_agg = aggregates.pop(RESIDENT, None)
    if args.resident and resident_agg is None:            # an in-memory --target is the resident target
        resident_agg = {**aggregates["ar"], "mode": RESIDENT, "same_as_ar": True}
    if resident_agg is not None:
        resident_agg.setdefault("same_as_ar", False)

    print_table(aggregates, resident_agg, streamed)
    print_lever(aggregates)
    from ..policy import save_calibration
    for pol in policies:
        save_calibration(pol)
    if not greedy:
        print(f"# temperature {params.temperature:g}, seed {params.seed}: position-keyed draws, so every mode's "
              f"text is checked against ar's", flush=True)
    bugs = [label for label, divs in checks.items() for d in divs if not d.get("near_tie")]
    if bugs:
        print(f"# WARNING: {len(bugs)} run(s) differ from ar without a near-tie ({', '.join(sorted(set(bugs)))}): "
              f"a bug in the speculative path", flush=True)

    result = {
        "benchmark": "lever bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {"target": target_name, "target_kind": "store" if streamed else "model",
                   "draft": args.draft if needs_draft else None, "dram_budget_bytes": budget,
                   "modes": [m.label for m in modes], "ar_added": ar_added, "resident": args.resident,
                   "prompt_set": args.prompt_set, "categories": args.categories, "prompts": len(prompts),
                   "new_tokens": new_tokens, "ignore_eos": args.ignore_eos,
                   "temperature": args.temperature, "seed": args.seed, "raw_read_bytes_per_s": raw_read_bps,
                   "dtype": args.dtype, "reader": args.reader, "prefetch_depth": args.prefetch_depth,
                   "drop_caches": args.drop_caches, "page_cache": page_cache, "quick": args.quick,
                   "kernels": kernels,
                   "chat_template": True},
        "machine": machine_info(),
        "target": ({"store": str(store), "storage": manifest.storage, "weights_bytes": manifest.weights_bytes,
                    "n_layers": manifest.config.n_layers, "reader": reader_info,
                    "residency": target.plan.summary()} if streamed
                   else {"path": str(loaded.path), "n_layers": target.config.n_layers}),
        "timing_s": {"load": round(load_s, 3), "bench": round(bench_s, 3)},
        "prompts": [{"id": p["id"], "category": p["category"], "source": p["source"], "prompt_tokens": len(i)}
                    for p, i in zip(prompts, ids)],
        "modes": aggregates,
        "resident": resident_agg,
        "runs": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / f"{args.name}.json", out_dir / f"{args.name}.png"
    json_path.write_text(json.dumps(result, indent=1))
    wrote = [str(json_path)]
    try:
        plot(result, png_path)
        wrote.append(str(png_path))
    except ImportError:
        print("# PNG skipped: matplotlib is not installed (pip install 'lever[bench]')", flush=True)
    print(f"# wrote {' and '.join(wrote)}", flush=True)
    return 0


# -- aggregation -----------------------------------------------------------------

def aggregate(label: str, runs: list, divergences: list[dict] | None, is_ar: bool) -> dict:
    """Totals over all prompts of one mode (tokens/s = total tokens / total decode time)."""
    def totals(sel: list) -> dict:
        gen = sum(len(r.token_ids) for _, _, r, _ in sel)
        dec = sum(r.decode_s for _, _, r, _ in sel)
        passes = sum(s.iterations for *_, s in sel)
        return {"generated_tokens": gen, "decode_s": round(dec, 4),
                "tokens_per_s": round(gen / dec, 3) if dec else 0.0, "target_passes": passes,
                "mean_accepted_length": round(gen / passes, 3) if passes else 0.0}

    stats = [s for *_, s in runs]
    sizes = [n for s in stats for n in s.tree_sizes]
    draft_nodes, accepted = sum(s.draft_nodes for s in stats), sum(s.accepted for s in stats)
    t = totals(runs)
    bytes_read = sum(s.bytes_read for s in stats)
    out = {
        "mode": label, "runs": len(runs), **t,
        "prefill_s": round(sum(r.prefill_s for _, _, r, _ in runs), 4),
        "draft_tokens": draft_nodes, "accepted_draft_tokens": accepted,
        "acceptance_rate": round(accepted / draft_nodes, 4) if draft_nodes else None,
        "mean_tree_size": round(sum(sizes) / len(sizes), 3) if sizes else 0.0,
        "bytes_read": bytes_read,
        "bytes_read_per_token": bytes_read / t["generated_tokens"] if t["generated_tokens"] else None,
        "time_split_s": {"draft": round(sum(s.draft_s for s in stats), 4),
                         "verify_compute": round(sum(s.verify_s - s.stall_s for s in stats), 4),
                         "io_stall": round(sum(s.stall_s for s in stats), 4),
                         "accept": round(sum(s.accept_s for s in stats), 4)},
        "per_category": {c: totals([x for x in runs if x[0]["category"] == c])
                         for c in dict.fromkeys(x[0]["category"] for x in runs)},
    }
    if is_ar:
        out["mismatches"] = out["mismatches_near_tie"] = 0
    else:
        out["mismatches"] = len(divergences or [])
        out["mismatches_near_tie"] = sum(1 for d in divergences or [] if d.get("near_tie"))
    return out


def divergence(model, prompt_ids: list[int], ref: list[int], got: list[int], params) -> dict:
    """Where `got` first differs from ar's `ref`, and whether the two tokens
    were a near-tie there: greedy, both logits within ~2 bf16 ulps of the top
    logit; sampled, their Gumbel-max scores (processed logits + the
    position's noise) within the same margin scaled by 1/temperature."""
    from ..autoregressive import prefill
    from ..sampling import position_noise, processed_logits

    i = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    out = {"index": i, "ar_token": ref[i] if i < len(ref) else None, "token": got[i] if i < len(got) else None}
    if out["ar_token"] is None or out["token"] is None:
        out["near_tie"] = False
        return out
    cache = model.new_cache(capacity=len(prompt_ids) + i + 1)
    logits = prefill(model, list(prompt_ids) + ref[:i], cache).astype(np.float32)
    tol = 2.0 ** -6 * max(1.0, abs(float(logits.max())))
    if not params.greedy:
        tol /= params.temperature
        logits = processed_logits(logits, params).astype(np.float64) + position_noise(
            params.seed, len(prompt_ids) + i, logits.shape[-1])
    top = float(logits.max())
    a, b = float(logits[ref[i]]), float(logits[got[i]])
    out.update(ar_logit=a, logit=b, top_logit=top, tolerance=tol, near_tie=top - min(a, b) <= tol)
    return out


def machine_info() -> dict:
    """The machine and software versions (torch's only when the torch reference is loaded)."""
    from .. import __version__
    torch = sys.modules.get("torch")
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        pass
    return {"machine": platform.machine(), "platform": platform.platform(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "numpy": np.__version__, "lever": __version__,
            **({"torch": torch.__version__, "torch_threads": torch.get_num_threads()} if torch else {})}


# -- output ----------------------------------------------------------------------

def _fmt_mismatch(a: dict) -> str:
    if a["mode"] == "ar":
        return "(reference)"
    if a.get("mismatches") is None:
        return "-"
    m, tie = a["mismatches"], a["mismatches_near_tie"]
    return f"{m}" + (f" ({tie} tie)" if tie else "")


def print_table(aggregates: dict, resident: dict | None, streamed: bool) -> None:
    head = (f"{'mode':<14}{'tok/s':>9}{'vs ar':>8}{'acc.len':>9}{'tree':>7}{'MB/tok':>9}{'I/O tok/s':>10}"
            f"{'draft s':>9}{'verify s':>10}{'stall s':>9}{'accept s':>10}  mismatches")
    print(head)
    print("-" * len(head))
    lines = list(aggregates.values())
    if resident is not None and not resident.get("same_as_ar"):
        lines.append(resident)
    for a in lines:
        ts = a["time_split_s"]
        flash = streamed and a["mode"] != RESIDENT and a["bytes_read_per_token"] is not None
        mb = f"{a['bytes_read_per_token'] / 1e6:9.2f}" if flash else f"{'-':>9}"
        bound = a.get("io_bound_tokens_per_s")
        io = f"{bound:10.1f}" if flash and bound else f"{'-':>10}"
        print(f"{a['mode']:<14}{a['tokens_per_s']:9.2f}{(a['ratio_vs_ar'] or 0):7.2f}x{a['mean_accepted_length']:9.2f}"
              f"{a['mean_tree_size']:7.1f}{mb}{io}{ts['draft']:9.2f}{ts['verify_compute']:10.2f}{ts['io_stall']:9.2f}"
              f"{ts['accept']:10.2f}  {_fmt_mismatch(a)}")
    if resident is not None and resident.get("same_as_ar"):
        print(f"{RESIDENT:<14}= ar (the --target model is memory-resident)")
    sys.stdout.flush()


def print_lever(aggregates: dict) -> None:
    """One line per lever mode: tree sizes, predicted vs realised length and time."""
    for a in aggregates.values():
        lv = a.get("lever")
        if not lv or not lv.get("iterations"):
            continue
        ts, al, it = lv["tree_size"], lv["accepted_length"], lv["iteration_s"]
        hist = " ".join(f"{k}:{v}" for k, v in ts["histogram"].items())
        cal = lv["calibration"]
        print(f"# {a['mode']}: tree nodes mean {ts['mean']:.1f} p50 {ts['p50']:.0f} p90 {ts['p90']:.0f} max {ts['max']} "
              f"[{hist}]; accepted length predicted {al['predicted_mean']:.2f} realised {al['realised_mean']:.2f}; "
              f"iteration predicted {it['predicted_mean'] * 1e3:.0f} ms realised {it['realised_mean'] * 1e3:.0f} ms; "
              f"policy {lv['grow_us_mean']:.0f} us/iteration; calibration ECE {cal['ece_calibrated'] or 0:.3f} "
              f"(draft prob {cal['ece_draft_prob'] or 0:.3f}, {cal['observations']} observations, "
              f"{lv['calibration_observations_at_start']} at start); profile I/O share at n=1 "
              f"{100 * lv['io_share_n1']:.0f}%", flush=True)


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aggs = list(r["modes"].values())
    names = [a["mode"] for a in aggs]
    tps = [a["tokens_per_s"] for a in aggs]
    colors = ["tab:gray" if n == "ar" else "tab:blue" if n.startswith("chain") else
              "tab:red" if n.startswith(LEVER) else "tab:orange" for n in names]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.5))
    bars = ax.bar(names, tps, color=colors)
    for b, a in zip(bars, aggs):
        ax.annotate(f"L={a['mean_accepted_length']:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ar = r["modes"]["ar"]["tokens_per_s"]
    ax.axhline(ar, color="black", ls="--", lw=1, label=f"ar {ar:.2f} tok/s")
    top = max(tps)
    res = r.get("resident")
    if res is not None and not res.get("same_as_ar"):
        ax.axhline(res["tokens_per_s"], color="tab:green", ls=":", lw=1.5,
                   label=f"resident ar {res['tokens_per_s']:.2f} tok/s")
        top = max(top, res["tokens_per_s"])
    ax.set_ylim(0, top * 1.25 if top > 0 else 1)
    ax.set_ylabel("decode tokens/s")
    c = r["config"]
    budget = f", budget {c['dram_budget_bytes'] / 1e6:,.0f} MB" if c["dram_budget_bytes"] else " (in memory)"
    ax.set_title(f"{Path(c['target']).name}{budget}; draft {c['draft']}\n{c['prompts']} prompts ({c['prompt_set']}), "
                 f"{c['new_tokens']} tokens, T={c['temperature']:g}; L = mean accepted length", fontsize=9)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
