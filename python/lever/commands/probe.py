"""`lever probe`: early-exit probes for a target.

    lever probe record --target-store DIR --draft NAME --out TRACES [--prompts N] [--max-new-tokens N] [--layers 7,9,14,21]
    lever probe train --traces TRACES [--recall 0.99] [--cache-dir DIR]
    lever probe report --traces TRACES

record runs the calibration prompt corpus (lever/data/calibration_prompts_v1.json,
disjoint from the bench prompts) greedily under a static tree (every node of
a wide tree) and mode lever, and records every tree node (lever.probe.traces);
train fits a probe per recorded layer and the draft-only baseline on the
training prompts, prints the held-out table, writes the chosen probe keyed by
the target (lever.probe.store) and report.json + report.png into the trace
directory; report prints that table again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..atomic_write import write_atomic
from ..errors import LeverError
from . import arg_types
from .options import (add_backend_options, add_cache_dir, add_compute_options, add_context, add_draft, add_draft_head, add_dram_budget,
                      add_max_new_tokens, add_no_progress, add_reader_options, add_target_choice)

CORPUS = "calibration_prompts_v1.json"
REPORT_JSON, REPORT_PNG = "report.json", "report.png"
TREE_SHAPE = dict(budget=32, topk=4, depth=8)     # "all nodes": a wide static tree
LEVER_MAX_NODES = 64


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "probe", help="record traces, train and report early-exit probes for a target",
        description="Early-exit probes: record verification traces over a prompt corpus, train a small "
                    "logistic probe per candidate layer, and report its held-out recall and pruning.")
    sub = p.add_subparsers(dest="probe_command", metavar="STEP")
    sub.required = True
    add_record(sub)
    add_train(sub)
    add_report(sub)


def add_record(sub) -> None:
    p = sub.add_parser("record", help="record tree passes over the calibration prompts",
                       description="Run the calibration prompts greedily under a static tree "
                                   f"(budget {TREE_SHAPE['budget']}, top-{TREE_SHAPE['topk']}, depth "
                                   f"{TREE_SHAPE['depth']}) and mode lever, recording every draft node.")
    add_target_choice(p)
    add_draft(p, required=True, note="a draft model: mode lever needs its probabilities")
    add_draft_head(p)
    p.add_argument("--out", type=arg_types.directory, required=True, metavar="DIR", help="trace directory to write")
    p.add_argument("--prompts", type=arg_types.integer(2, 10_000), default=None, metavar="N",
                   help="the first N prompts of the corpus (default all)")
    add_max_new_tokens(p, default=128, old="--new-tokens",
                       help="tokens generated per prompt and policy (default 128)")
    p.add_argument("--layers", type=layer_list, default=None, metavar="K,K,...",
                   help="decoder layers (0-based) after which to record (default about L/4, L/3, L/2, 3L/4)")
    p.add_argument("--policies", type=policy_list, default=["tree", "lever"], metavar="P,P",
                   help="tree (every node of a wide static tree) and/or lever (default tree,lever)")
    p.add_argument("--no-hidden", action="store_true",
                   help="do not keep the parents' hidden states (float16; most of the traces' size): lens only")
    add_dram_budget(p)
    add_compute_options(p, kernels=False)
    add_reader_options(p)
    add_cache_dir(p)
    add_no_progress(p)
    add_context(p, offered=False)
    add_backend_options(p, offered=False)
    p.set_defaults(run=run_record)


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train probes on recorded traces and store the chosen one",
                       description="Fit a probe per recorded layer and the draft-only baseline on the training "
                                   "prompts, report held-out recall and pruning, and store the probe whose layer "
                                   "and threshold give the best expected tokens/s at the recall floor.")
    p.add_argument("--traces", type=arg_types.name, required=True, metavar="DIR",
                   help="a `lever probe record` directory")
    p.add_argument("--recall", type=recall_value, default=0.99, metavar="R",
                   help="recall floor for the stored threshold, 0..1 (default 0.99; 0: best tokens/s)")
    p.add_argument("--store", choices=["gain", "always"], default="gain",
                   help="gain: store the chosen probe only if it prunes and its held-out tokens/s beats no "
                        "pruning (else remove this target's probe file, so --probes auto stays off); "
                        "always: store it anyway (default gain)")
    p.add_argument("--profile", type=arg_types.name, default=None, metavar="PATH",
                   help="device profile JSON for the cost (default: the one recorded with the traces, "
                        "else a line fitted to the recorded pass times)")
    add_cache_dir(p)
    p.add_argument("--no-plot", action="store_true", help="do not write report.png")
    p.set_defaults(run=run_train)


def add_report(sub) -> None:
    p = sub.add_parser("report", help="print the table of a trained trace directory again")
    p.add_argument("--traces", type=arg_types.name, required=True, metavar="DIR", help="a trained trace directory")
    p.add_argument("--json", action="store_true", help="print report.json")
    p.set_defaults(run=run_report)


def layer_list(text: str) -> list[int]:
    try:
        layers = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        layers = []
    if not layers or layers[0] < 0:
        raise argparse.ArgumentTypeError(f"expected layer numbers like 7,9,14,21, got {text!r}")
    return layers


def policy_list(text: str) -> list[str]:
    from ..probe.traces import POLICIES
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or any(n not in POLICIES for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected policies from {', '.join(POLICIES)}, got {text!r}")
    return names


def recall_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a recall from 0 to 1, got {text!r}")
    return value


# -- record ------------------------------------------------------------------------------

def corpus_prompts(limit: int | None) -> list[dict]:
    """The calibration corpus (id, category, source, text), the first `limit` prompts."""
    import importlib.resources
    data = json.loads(importlib.resources.files("lever").joinpath("data", CORPUS).read_text())
    prompts = data["prompts"]
    return [dict(p) for p in (prompts[:limit] if limit else prompts)]


def run_record(args: argparse.Namespace) -> int:
    from ..config import DecodeConfig, RunConfig
    from ..probe.store import probe_key_for
    from ..probe.traces import default_layers, record_traces
    from ..runtime import MIN_KV_TOKENS, PromptSetKv, build
    from ..shapes import TreeShape

    if args.draft == "ngram":
        raise LeverError("lever probe record needs a draft model (--draft NAME): prompt lookup ('ngram') has "
                         "no draft probabilities")
    config = RunConfig.from_args(args)
    progress = config.progress
    prompts = corpus_prompts(args.prompts)
    tree = TreeShape(**TREE_SHAPE)
    rows = 1 + max(TREE_SHAPE["budget"], LEVER_MAX_NODES)
    kv = PromptSetKv([p["text"] for p in prompts], new_tokens=args.max_new_tokens, extra=rows + 2,
                     in_memory=MIN_KV_TOKENS)
    run = build(config, tree_rows=rows, sampling=False, kv=kv, load_draft=False)
    loaded, name = run.loaded, config.target.name
    ids = kv.prompt_ids(loaded)
    target = loaded.model
    try:
        run.load_draft()
        drafter = run.drafter
        specs, profile = {}, None
        if "tree" in args.policies:
            specs["tree"] = DecodeConfig(mode="tree", tree=tree).spec()
        if "lever" in args.policies:
            decode = DecodeConfig(mode="lever", lever_max_nodes=LEVER_MAX_NODES)
            policy = run.lever_policy(decode, context_tokens=MIN_KV_TOKENS, tune_ring=False)
            specs["lever"] = decode.spec(policy=policy)
            profile = getattr(policy.cost, "profile", None)
        layers = args.layers or default_layers(target.config.n_layers)
        meta = record_traces(target, drafter, [{**p, "ids": i} for p, i in zip(prompts, ids)], args.out,
                             layers=layers, new_tokens=args.max_new_tokens, specs=specs,
                             key=probe_key_for(target, loaded.path), target_name=name, draft_name=args.draft,
                             corpus=f"lever/data/{CORPUS}", stop_ids=loaded.tokenizer.eos_token_ids,
                             profile=profile, progress=progress, keep_hidden=not args.no_hidden)
        run.save_calibrations()
    finally:
        run.close()
    nodes = sum(p["nodes"] for p in meta["prompts"])
    trees = sum(p["trees"] for p in meta["prompts"])
    print(f"traces: {args.out}: {len(meta['prompts'])} prompts, {trees} trees, {nodes} nodes, "
          f"layers {','.join(map(str, meta['layers']))}")
    return 0


# -- train / report -------------------------------------------------------------------------

def run_train(args: argparse.Namespace) -> int:
    from ..probe.evaluate import evaluate, format_table
    from ..probe.traces import load_traces
    from ..probe.train import split_prompts, train_scorers

    traces = load_traces(args.traces)
    held = split_prompts(traces.nodes["prompt"])
    if not (~held).any() or not held.any():
        raise LeverError(f"{args.traces}: the traces hold no nodes to train on or to hold out")
    if not traces.nodes["match"].any():
        raise LeverError(f"{args.traces}: no traced node was accepted-able (match); nothing to learn")
    cost = cost_for(traces, args.profile)
    scorers = train_scorers(traces, ~held)
    report = evaluate(traces, scorers, held, cost, min_recall=args.recall)
    report.update(target=traces.meta.get("target", ""), key=traces.meta["key"], traces=str(traces.path))
    path, verdict = store_chosen(report, traces, args)
    report.update(probe_path=str(path) if path else None, not_stored=verdict)
    out = Path(args.traces)
    write_atomic(out / REPORT_JSON, json.dumps(report, indent=1))
    plotted = not args.no_plot
    if plotted:
        from ..plotting import PlotUnavailableError
        from ..probe.plot import plot_probe_report
        try:
            plot_probe_report(report, out / REPORT_PNG, title=f"{report['target']}: held-out probes")
        except PlotUnavailableError as e:             # the probe and the JSON report stand without it
            print(f"# {REPORT_PNG} skipped: {e}")
            plotted = False
    print(format_table(report))
    print(f"probe: {path}" if path is not None else f"no probe stored: {verdict}")
    print(f"report: {out / REPORT_JSON}" + (f", {out / REPORT_PNG}" if plotted else ""))
    sys.stdout.flush()
    return 0


def store_chosen(report: dict, traces, args) -> tuple[Path | None, str | None]:
    """Write the chosen probe (see `store_verdict`): (its path, None), or (None, why
    not), after removing an earlier probe of the target, which the traces disown."""
    import numpy as np

    from ..probe.store import ProbeModel, probe_path, save_probe

    verdict = store_verdict(report, args.store)
    worth = store_verdict(report, "gain") is None          # what --probes auto follows
    if verdict is not None:
        old = probe_path(traces.meta["key"], args.cache_dir)
        if old.exists():
            old.unlink()
            verdict += f"; removed the earlier probe {old}"
        return None, verdict
    chosen = report["scorers"][report["chosen"]]
    e = chosen["default"]
    probe = ProbeModel(layer=chosen["layer"], weights=np.asarray(chosen["weights"]),
                       threshold=e["threshold"] if e["threshold"] is not None else NO_PRUNING,
                       key=traces.meta["key"], target=traces.meta.get("target", ""),
                       recall=e["recall"] if e["recall"] is not None else float("nan"),
                       metrics={"min_recall": args.recall, "held_out": e, "cost": report["cost"],
                                "traces": str(Path(args.traces).resolve()), "auto": worth,
                                "survive": e.get("survive") if e.get("survive") is not None else 1.0})
    return save_probe(probe, args.cache_dir), None


def store_verdict(report: dict, mode: str) -> str | None:
    """None when the chosen probe is to be stored, else why not."""
    chosen = report["chosen"]
    if chosen is None:
        return "the traces recorded no layer"
    if mode == "always":
        return None
    e = report["scorers"][chosen]["default"]
    if e["threshold"] is None:
        return f"at its recall floor the best setting of {chosen} prunes nothing"
    if e["speed"] is None or e["speed"] <= 1.0:
        return f"{chosen} does not beat running without probes on held-out prompts"
    return None


NO_PRUNING = -1e30        # the stored threshold of a probe whose best setting prunes nothing


def cost_for(traces, profile_path: str | None):
    """The pass cost: --profile, else the traces' profile.json, else a line fitted to their pass times."""
    from ..cost.cost_model import CostModel
    from ..cost.device_profile import DeviceProfile
    from ..errors import ProfileError
    from ..probe.evaluate import LinearCost, ProfileCost

    path = Path(profile_path) if profile_path else (traces.path / traces.meta["profile"]
                                                   if traces.meta.get("profile") else None)
    if path is None:
        return LinearCost.fit(traces)
    try:
        return ProfileCost(CostModel(DeviceProfile.from_json(json.loads(path.read_text()))))
    except (OSError, ValueError, KeyError, TypeError, ProfileError) as e:
        raise LeverError(f"{path}: cannot use the device profile ({e})") from None


def run_report(args: argparse.Namespace) -> int:
    from ..probe.evaluate import format_table
    from ..probe.traces import read_meta

    read_meta(args.traces)
    path = Path(args.traces) / REPORT_JSON
    if not path.is_file():
        raise LeverError(f"{args.traces}: no {REPORT_JSON} yet (run `lever probe train --traces {args.traces}`)")
    try:
        report = json.loads(path.read_text())
        text = json.dumps(report, indent=1) if args.json else format_table(report)
    except (ValueError, KeyError, TypeError) as e:
        raise LeverError(f"{path}: damaged ({e}); run `lever probe train` again") from None
    print(text)
    return 0
