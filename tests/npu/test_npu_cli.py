"""`--backend native|cpu-static|qnn` on generate, bench and profile, `lever
compile-npu`, `--npu-profile FILE` and the static-shape cost profile.

- The options parse (and refuse junk) on every command; what a static
  backend cannot run (--kernels torch, --remote, --probes on, --soc without
  qnn) is refused in one line before anything loads.
- An npu profile is validated field by field (one line naming the field),
  and its step function over the row buckets makes the gain-cost grower end
  trees on bucket edges.
- A profile measured on a static backend is keyed on it, measured at the
  row buckets, marked fixed_shapes (and simulated for qnn off ARM).
- With SmolLM2-135M (`real`): generate / bench / profile on cpu-static
  report the backend and the draft/verify overlap; compile-npu writes
  context binaries that a fresh process loads and runs; one qnn generation
  (a single target pass on the simulated HTP, ~6 s) in a subprocess, since
  QNN settings are per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from lever.cli import build_parser, main
from lever.cost.cost_model import CostModel
from lever.cost.npu_profile import SCHEMA, NpuProfileError, load_npu_profile, parse_npu_profile
from lever.draft.gain_cost import GainCostPolicy
from lever.engine import SpecStats, overlap_json
from test_grow_tree import Universe
from tiny_model import write_tiny_gguf
from waiting import deadline

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {"generate": ["generate", "--prompt", "hi"], "bench": ["bench", "--quick"],
            "profile": ["profile", "--draft", "smollm2-135m"]}


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(err: str) -> str:
    """The single `lever: error:` line of stderr (and nothing else on it)."""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("lever: error: "), err
    return lines[0]


# --- options -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_backend_options_parse_on_every_command(command):
    parser = build_parser()
    args = parser.parse_args(COMMANDS[command])
    assert (args.backend, args.buckets, args.contexts, args.soc, args.npu_profile) == \
        ("native", "1,8,16,32,64,128", "128,256,512,1024,2048", None, None)
    args = parser.parse_args([*COMMANDS[command], "--backend", "qnn", "--buckets", "16,1,8,8", "--contexts",
                              "512,64,", "--soc", "43", "--npu-profile", "phone.json"])
    assert (args.backend, args.buckets, args.contexts, args.soc, args.npu_profile) == \
        ("qnn", "1,8,16", "64,512", "43", "phone.json")


@pytest.mark.parametrize("argv, fragment", [
    (["--backend", "npu"], "argument --backend: invalid choice"),
    (["--buckets", "1,x"], "argument --buckets: cannot read the row buckets '1,x'"),
    (["--buckets", "0,8"], "argument --buckets"),
    (["--contexts", ""], "argument --contexts: no context buckets given"),
    (["--soc", "99"], "argument --soc: unsupported SoC model '99': choose one of 57"),
])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_backend_option_is_one_line(command, argv, fragment, capsys):
    rc, _, err = run_cli(capsys, [*COMMANDS[command], *argv])
    assert rc == 2 and fragment in one_error(err)


@pytest.mark.parametrize("argv, fragment", [
    (["generate", "--prompt", "hi", "--backend", "cpu-static", "--kernels", "torch"], "--kernels torch"),
    (["generate", "--prompt", "hi", "--backend", "qnn", "--remote", "http://127.0.0.1:9", "--draft", "x"],
     "with --remote the server verifies"),
    (["generate", "--prompt", "hi", "--backend", "qnn", "--draft", "x", "--mode", "tree", "--probes", "on"],
     "--probes on prunes tree rows mid-pass, which --backend qnn cannot"),
    (["generate", "--prompt", "hi", "--backend", "cpu-static", "--soc", "57"], "--soc chooses the SoC of --backend qnn"),
    (["generate", "--prompt", "hi", "--npu-profile", "p.json", "--remote", "http://127.0.0.1:9", "--draft", "x"],
     "--npu-profile sizes the trees of a target in this process"),
    (["bench", "--backend", "cpu-static", "--kernels", "torch"], "--kernels torch"),
    (["bench", "--backend", "cpu-static", "--probes", "on"], "--probes on"),
    (["profile", "--draft", "x", "--backend", "qnn", "--kernels", "torch"], "--kernels torch"),
    (["profile", "--draft", "x", "--backend", "qnn", "--probes", "on"], "--probes on"),
    (["profile", "--draft", "x", "--npu-profile", "/nonexistent/phone.json"], "--npu-profile /nonexistent/phone.json: "
                                                                              "cannot be read"),
])
def test_what_a_static_backend_cannot_run_is_refused_before_loading(argv, fragment, capsys):
    rc, _, err = run_cli(capsys, argv)
    assert rc == 2 and fragment in one_error(err)


def test_probes_auto_is_off_on_a_static_backend():
    from lever.commands.static_backend import check_backend_args
    args = Namespace(backend="cpu-static", soc=None, npu_profile=None, probes="auto")
    checks = check_backend_args(args, probes=args.probes)
    assert checks.probes == "off" and checks.npu_profile is None
    assert args.probes == "auto"                    # the parsed options are never written
    args = Namespace(backend="native", soc=None, npu_profile=None, probes="auto")
    assert check_backend_args(args, probes=args.probes).probes == "auto"


def test_draft_ahead_is_the_static_default_with_a_draft_model():
    from lever.commands.bench_setup import with_static_defaults
    from lever.commands.bench_modes import parse_modes
    from lever.commands.static_backend import draft_ahead_default

    def ns(backend, draft="smollm2-135m", no=False):
        return Namespace(backend=backend, draft=draft, no_draft_ahead=no)
    assert draft_ahead_default(ns("qnn"), "smollm2-135m") and draft_ahead_default(ns("cpu-static"), "m")
    assert not draft_ahead_default(ns("native"), "m") and not draft_ahead_default(ns("qnn"), "ngram")
    assert not draft_ahead_default(ns("qnn", no=True), "m") and not draft_ahead_default(ns("qnn"), None)
    modes, _ = parse_modes(["tree:16", "chain:4+ahead", "tree:16+ahead", "lever"])
    out, added = with_static_defaults(ns("qnn"), modes)
    assert [m.label for m in out] == ["ar", "tree:16+ahead", "chain:4+ahead", "lever+ahead"]
    assert all(m.draft_ahead and (m.spec is None or m.spec.draft_ahead) for m in out[1:])
    assert [m.label for m in added] == ["tree:16+ahead", "lever+ahead"]
    assert with_static_defaults(ns("qnn", no=True), modes)[0] == modes
    assert with_static_defaults(ns("qnn", draft="ngram"), modes)[0] == modes


def test_capped_bench_children_get_the_backend_options():
    """bench --memory-cap rebuilds each child's command line: a bucket list is one argument."""
    from lever.commands.bench_capped import child_command
    from lever.commands.bench_modes import parse_mode
    args = build_parser().parse_args(["bench", "--backend", "cpu-static", "--buckets", "8,1", "--contexts", "64",
                                      "--memory-cap", "2GB", "--no-draft-ahead"])
    argv = child_command(args, parse_mode("tree:8"), Path("/tmp"))
    i = argv.index("--buckets")
    assert argv[i + 1] == "1,8" and argv[argv.index("--contexts") + 1] == "64"
    assert "--backend" in argv and argv[argv.index("--backend") + 1] == "cpu-static" and "--no-draft-ahead" in argv
    assert "--soc" not in argv


def test_overlap_is_wall_time_against_draft_plus_verify():
    o = overlap_json(iteration_s=3.0, draft_s=1.0, ahead_s=0.5, verify_s=2.0, accept_s=0.1)
    assert o["serial_s"] == 3.6 and o["hidden_s"] == pytest.approx(0.6) and o["share"] == pytest.approx(0.4)
    assert o["ratio"] == pytest.approx(1.2)
    o = overlap_json(iteration_s=3.5, draft_s=1.0, ahead_s=0.0, verify_s=2.0, accept_s=0.1)
    assert o["hidden_s"] == 0.0 and o["share"] == 0.0                      # nothing side by side: never < 0
    s = SpecStats(iterations=2, draft_s=1.0, verify_s=2.0, accept_s=0.1, iteration_s=3.0)
    assert s.to_json(4)["overlap"] == s.overlap() and s.overlap()["hidden_s"] == pytest.approx(0.1)


# --- npu profiles ------------------------------------------------------------------------

BUCKETS = (1, 8, 16, 32, 64, 128)
LAYERS = 4


def profile_doc(rows=BUCKETS, contexts=(256, 1024), step: float = 1.0, **extra) -> dict:
    """A full npu profile: layer seconds flat within (1..16] and a step at 16 rows (x `step`)."""
    def layer(r, c):
        base = 0.002 * (1 + c / 4096)
        return base * (1.0 + 0.01 * r / 16) if r <= 16 else base * (1.5 + step) * (r / 32) ** 0.5
    doc = {"schema": SCHEMA, "device": "test phone", "soc_model": "57", "layers": LAYERS,
           "buckets": [{"rows": r, "context": c, "layer_s": layer(r, c)} for r in rows for c in contexts],
           "embed_s": {str(r): 1e-5 for r in rows}, "head_s": {str(r): 0.001 + 1e-5 * r for r in rows},
           "draft_s": {"1": 1e-5, "8": 2e-5, "64": 5e-5, "256": 1e-4}, "iteration_overhead_s": 1e-4}
    doc.update(extra)
    return doc


class FakeTarget:
    """What a profile needs of a resident target: its config (no plan, no static layers)."""

    def __init__(self, n_layers: int = LAYERS):
        self.config = Namespace(n_layers=n_layers, vocab_size=64)


def write(tmp_path, doc, name="phone.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_a_valid_npu_profile_loads_and_picks_its_context(tmp_path):
    p = load_npu_profile(write(tmp_path, profile_doc()))
    assert p.rows == BUCKETS and p.contexts == (256, 1024) and p.layers == LAYERS and len(p.sha256) == 64
    assert p.context_for(100)[0] == 256 and p.context_for(256)[0] == 256 and p.context_for(257)[0] == 1024
    ctx, why = p.context_for(5000)
    assert ctx == 1024 and "largest" in why
    assert p.missing(streamed=True) == ["flash_bytes_per_s"] and p.missing(streamed=False) == []
    prof, info = p.device_profile(FakeTarget(), 300)
    assert prof.fixed_shapes and prof.backend == "npu-profile" and not prof.simulated and prof.n_grid == list(BUCKETS)
    assert info["context"] == 1024 and info["from_host"] == [] and "smallest" in info["context_rule"]
    assert [s.name for s in prof.stages] == [f"layer.{i}" for i in range(LAYERS)] + ["head"]
    assert prof.stages[0].compute_s == p.layer_curve(1024)
    assert prof.draft_grid == [1, 8, 64, 256] and prof.iteration_overhead_s == 1e-4


def _bad(doc_change):
    doc = profile_doc()
    doc_change(doc)
    return doc


BAD_DOCS = {
    "not an object": ([1, 2], "must hold a JSON object"),
    "schema missing": (_bad(lambda d: d.pop("schema")), "field 'schema' is missing"),
    "schema wrong": (_bad(lambda d: d.update(schema="lever-npu-profile/2")), "field 'schema' must be"),
    "device empty": (_bad(lambda d: d.update(device=" ")), "field 'device' must be a non-empty string"),
    "soc not a string": (_bad(lambda d: d.update(soc_model=57)), "field 'soc_model' must be a non-empty string"),
    "layers zero": (_bad(lambda d: d.update(layers=0)), "field 'layers' must be a positive integer"),
    "layers bool": (_bad(lambda d: d.update(layers=True)), "field 'layers' must be a positive integer"),
    "buckets empty": (_bad(lambda d: d.update(buckets=[])), "field 'buckets' must be a non-empty list"),
    "bucket not object": (_bad(lambda d: d["buckets"].__setitem__(2, 5)), "field 'buckets[2]' must be an object"),
    "rows missing": (_bad(lambda d: d["buckets"][1].pop("rows")), "field 'buckets[1].rows' is missing"),
    "rows float": (_bad(lambda d: d["buckets"][1].update(rows=8.0)), "field 'buckets[1].rows' must be a positive"),
    "context negative": (_bad(lambda d: d["buckets"][3].update(context=-1)), "field 'buckets[3].context' must be"),
    "layer_s missing": (_bad(lambda d: d["buckets"][0].pop("layer_s")), "field 'buckets[0].layer_s' is missing"),
    "layer_s zero": (_bad(lambda d: d["buckets"][4].update(layer_s=0)), "field 'buckets[4].layer_s' must be a "
                                                                         "positive finite number"),
    "layer_s string": (_bad(lambda d: d["buckets"][4].update(layer_s="1ms")), "field 'buckets[4].layer_s'"),
    "bucket extra field": (_bad(lambda d: d["buckets"][0].update(ms=1)), "field 'buckets[0].ms' is not a bucket "
                                                                          "field"),
    "bucket repeated": (_bad(lambda d: d["buckets"].append(dict(d["buckets"][0]))), "repeats bucket rows 1 "
                                                                                     "context 256"),
    "grid incomplete": (_bad(lambda d: d["buckets"].pop(3)), "field 'buckets' lacks rows 8 at context 1024"),
    "embed lacks a bucket": (_bad(lambda d: d["embed_s"].pop("16")), "field 'embed_s' lacks row bucket 16"),
    "head extra bucket": (_bad(lambda d: d["head_s"].update({"7": 0.1})), "field 'head_s' names 7, not a row bucket"),
    "head bad key": (_bad(lambda d: d["head_s"].update({"x": 0.1})), "field 'head_s.x' is not a row bucket"),
    "draft not object": (_bad(lambda d: d.update(draft_s=[0.1])), "field 'draft_s' must be a non-empty object"),
    "draft negative": (_bad(lambda d: d["draft_s"].update({"2": -0.1})), "field 'draft_s.2' must be a positive"),
    "overhead string": (_bad(lambda d: d.update(iteration_overhead_s="0")), "field 'iteration_overhead_s' must be"),
    "flash zero": (_bad(lambda d: d.update(flash_bytes_per_s=0)), "field 'flash_bytes_per_s' must be a positive"),
    "measured number": (_bad(lambda d: d.update(measured=2026)), "field 'measured' must be a string"),
    "unknown field": (_bad(lambda d: d.update(head_ms={})), "field 'head_ms' is not in schema lever-npu-profile/1"),
}


@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_a_bad_npu_profile_names_the_field(case, tmp_path):
    doc, fragment = BAD_DOCS[case]
    path = write(tmp_path, doc)
    with pytest.raises(NpuProfileError) as e:
        load_npu_profile(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"--npu-profile {path}: ") and fragment in msg, msg


@pytest.mark.parametrize("text, fragment", [("{", "not JSON"), ('{"layers": NaN}', "not JSON"),
                                            (b"\xff\xfe", "not JSON")])
def test_an_unreadable_npu_profile_is_one_line(text, fragment, tmp_path):
    path = tmp_path / "phone.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(NpuProfileError, match=fragment):
        load_npu_profile(path)


def test_an_npu_profile_must_fit_the_target(tmp_path):
    from lever.model.native_loader import load_gguf_native
    from lever.npu.backend import use_static_backend
    from lever.npu.buckets import BucketSet

    p = load_npu_profile(write(tmp_path, profile_doc(rows=(1, 8), contexts=(64,), layers=2)))
    with pytest.raises(NpuProfileError, match="field 'layers' is 2, the target has 4 decoder layers"):
        p.check_target(FakeTarget(4))
    target = load_gguf_native(write_tiny_gguf(tmp_path / "t.gguf"), "float32")[0]
    p.check_target(target)                                         # native: any buckets will do
    use_static_backend(target, "cpu-static", BucketSet((1, 8, 16), (64,)))
    with pytest.raises(NpuProfileError, match="row buckets 1,8 differ from this run's --buckets 1,8,16"):
        p.check_target(target)
    q = load_gguf_native(tmp_path / "t.gguf", "float32")[0]
    use_static_backend(q, "qnn", BucketSet((1, 8), (64,)), root=tmp_path / "npu")   # SoC 57; nothing runs
    p.check_target(q)
    other = parse_npu_profile(profile_doc(rows=(1, 8), contexts=(64,), layers=2, soc_model="43"))
    with pytest.raises(NpuProfileError, match="field 'soc_model' is '43', this run prepares graphs for SoC '57'"):
        other.check_target(q)
    with pytest.raises(NpuProfileError, match="lacks embed_s, head_s"):
        parse_npu_profile({k: v for k, v in profile_doc().items() if k not in ("embed_s", "head_s")}
                          ).device_profile(FakeTarget(), 100)


def grown_size(policy: GainCostPolicy, universe: Universe) -> int:
    """Tree tokens (root included) the policy's grower selects from `universe`."""
    g = policy.grower()
    g.begin(7, [[1.0] * 4] * policy.max_depth, 0.0)
    pool = {0: 0}
    while nodes := g.next_expansion():
        for node in nodes:
            kids = universe.children[pool[node]]
            before = len(g.pool)
            g.add_children(node, np.arange(len(kids), dtype=np.int32) + 10,
                           np.log(np.full(len(kids), 0.25, dtype=np.float32)),
                           np.array([universe.accept[k] for k in kids]))
            for i in range(before, len(g.pool)):
                pool[i] = kids[g.rank(i)]
    return len(g.select()[0])


@pytest.mark.parametrize("seed", range(8))
def test_an_npu_profile_step_makes_lever_end_trees_on_bucket_edges(seed, tmp_path):
    """The step at 16 rows: the gain-cost policy driven by the npu profile's cost
    model ends every tree on a bucket edge (as tests/draft/test_grow_tree.py's
    synthetic bucketed curve), and never just past 16."""
    p = load_npu_profile(write(tmp_path, profile_doc(step=float(seed % 3))))
    prof, _ = p.device_profile(FakeTarget(), 200)
    cost = CostModel(prof)
    verify = cost.verify_s(128)
    assert verify[1] == verify[7] and verify[8] == verify[15] and verify[16] > verify[15]   # steps at 8, 16
    universe = Universe(np.random.default_rng(seed), width=4, depth=5)
    n = grown_size(GainCostPolicy(cost, max_nodes=127, max_depth=5, adapt=False), universe)
    assert n in BUCKETS, n


# --- measured profiles on a static backend -------------------------------------------------------

def test_a_static_backend_profile_is_keyed_and_stepped(tmp_path):
    from lever.cost.backend import simulated_npu
    from lever.cost.profile import load_or_measure, profile_key, profile_path
    from lever.model.native_loader import load_gguf_native
    from lever.npu.backend import use_static_backend
    from lever.npu.buckets import BucketSet

    path = write_tiny_gguf(tmp_path / "t.gguf")
    native, draft = (load_gguf_native(path, "float32")[0] for _ in range(2))
    static = load_gguf_native(path, "float32")[0]
    use_static_backend(static, "cpu-static", BucketSet((1, 8, 16), (64, 128)))

    def key(m):
        return profile_key(m, draft, target_id=path, draft_id=path, kernels="native", reader_backend="auto",
                           read_limit_bytes_per_s=0.0, dtype="float32")
    assert "static" not in key(native)["backend"]
    st = key(static)["backend"]["static"]
    assert st["layers"] == "cpu-static" and st["rows"] == [1, 8, 16] and st["contexts"] == [64, 128]
    assert st["soc_model"] is None and not st["simulated"] and "onnxruntime" in st["versions"]
    prof = load_or_measure(static, draft, key(static), cache_dir=tmp_path, progress=False, repeats=1)
    assert prof.fixed_shapes and prof.n_grid == [1, 8, 16] and prof.backend == "cpu-static" and not prof.simulated
    assert prof.key["measure"]["context_tokens"] == 96            # 128 - 32 (the overhead tree), within the buckets
    doc = json.loads(profile_path(prof.key, tmp_path).read_text())
    assert doc["fixed_shapes"] is True and doc["backend"] == "cpu-static" and doc["simulated"] is False
    v = CostModel(prof).verify_s(20)
    assert v[1] == v[7] and v[8] == v[15]                          # a step function over the buckets
    # the same models on the native backend: another key, another file
    assert profile_path({**key(native), "measure": prof.key["measure"]}, tmp_path) != profile_path(prof.key, tmp_path)
    # qnn: keyed on the SoC, simulated off ARM (nothing runs: the key needs no session)
    from lever.npu.runtime import QnnTarget
    q = load_gguf_native(path, "float32")[0]
    use_static_backend(q, "qnn", BucketSet((1, 8), (64,)), target=QnnTarget("57"), root=tmp_path / "npu")
    qk = key(q)["backend"]["static"]
    import platform
    assert qk["soc_model"] == "57" and qk["htp_arch"] == "75" and qk["graph_dtype"] == "float16"
    assert qk["simulated"] == simulated_npu(q) == (platform.machine() == "x86_64")


# --- SmolLM2-135M through the CLI ---------------------------------------------------------------

SMALL = ["--buckets", "1,8,16", "--contexts", "128,256"]


def generate_json(capsys, argv):
    rc, out, err = run_cli(capsys, ["generate", *argv, "--json"])
    assert rc == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.real
def test_generate_on_cpu_static_reports_the_backend_and_overlap(smollm2_path, tmp_path, capsys):
    common = ["--model", str(smollm2_path), "--prompt", "Write a haiku about rain.", "--max-new-tokens", "6",
              "--cache-dir", str(tmp_path), "--backend", "cpu-static", *SMALL]
    ar, _ = generate_json(capsys, common)
    tree, _ = generate_json(capsys, [*common, "--draft", str(smollm2_path), "--mode", "tree", "--tree-budget", "12"])
    assert tree["token_ids"] == ar["token_ids"]                   # greedy: the same tokens on the same backend
    b = tree["backend"]
    assert b["backend"] == "cpu-static" and b["rows_buckets"] == [1, 8, 16] and b["bucket_runs"] > 0
    assert b["split_passes"] >= 1 and 0 < b["padded_share"] < 1 and "soc_model" not in b   # 13 rows + prefill
    spec = tree["speculative"]
    assert "draft_ahead" in spec and spec["draft_ahead"]["forwards"] >= 0               # on by default
    ov = spec["overlap"]
    assert ov["iteration_s"] > 0 and ov["serial_s"] >= ov["draft_s"] + ov["verify_s"] - 1e-3
    off, _ = generate_json(capsys, [*common, "--draft", str(smollm2_path), "--mode", "tree", "--tree-budget", "12",
                                    "--no-draft-ahead"])
    assert "draft_ahead" not in off["speculative"] and off["token_ids"] == ar["token_ids"]
    rc, _, err = run_cli(capsys, ["generate", *common[:-len(SMALL)], "--buckets", "1,8", "--contexts", "64",
                                  "--draft", str(smollm2_path), "--mode", "tree", "--tree-budget", "4"])
    assert rc == 0 and "[backend cpu-static: buckets rows 1,8 x contexts 64" in err and "[overlap: iterations" in err


@pytest.mark.real
def test_generate_with_an_npu_profile_sizes_lever_trees_by_it(smollm2_path, tmp_path, capsys):
    doc = profile_doc(rows=(1, 8, 16), contexts=(128, 256), layers=30)
    path = write(tmp_path, doc)
    common = ["--model", str(smollm2_path), "--prompt", "Count: 1, 2, 3,", "--max-new-tokens", "8",
              "--cache-dir", str(tmp_path), "--draft", str(smollm2_path), "--mode", "lever", "--backend", "cpu-static",
              "--npu-profile", str(path)]
    out, err = generate_json(capsys, [*common, *SMALL])
    assert "measured in" not in err                              # nothing profiled here: the file had it all
    npu = out["npu_profile"]
    assert npu["device"] == "test phone" and npu["context"] == 128 and npu["from_host"] == []
    assert out["speculative"]["lever"]["iterations"] >= 1
    rc, _, err = run_cli(capsys, ["generate", *common, "--buckets", "1,8", "--contexts", "128,256"])
    assert rc == 2 and "differ from this run's --buckets 1,8" in one_error(err)
    rc, _, err = run_cli(capsys, ["generate", *common[:-8], "--draft", str(smollm2_path), "--mode", "tree",
                                  "--npu-profile", str(path)])
    assert rc == 2 and "--npu-profile sizes the trees of mode lever" in one_error(err)


@pytest.mark.real
def test_profile_on_cpu_static_measures_the_buckets(smollm2_path, tmp_path, capsys):
    argv = ["profile", "--target", str(smollm2_path), "--draft", str(smollm2_path), "--cache-dir", str(tmp_path),
            "--backend", "cpu-static", "--buckets", "1,8", "--contexts", "64", "--no-progress"]
    rc, out, err = run_cli(capsys, [*argv, "--json"])
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["fixed_shapes"] is True and doc["backend"] == "cpu-static" and doc["simulated"] is False
    assert doc["n_grid"] == [1, 8] and doc["key"]["backend"]["static"]["rows"] == [1, 8]
    rc, out, _ = run_cli(capsys, argv)                            # cached now: the table says what it is
    assert rc == 0 and "# backend cpu-static: static shapes, row buckets 1,8 (the pass cost is a step function)" in out
    phone = write(tmp_path, profile_doc(rows=(1, 8), contexts=(64,), layers=30))
    rc, out, err = run_cli(capsys, [*argv, "--npu-profile", str(phone), "--json"])
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["fixed_shapes"] is True and doc["backend"] == "npu-profile" and doc["n_grid"] == [1, 8]
    assert doc["npu_profile"]["context"] == 64 and "largest" in doc["npu_profile"]["context_rule"]


@pytest.mark.real
def test_bench_on_cpu_static_drafts_ahead_and_reports(smollm2_path, tmp_path, capsys):
    rc, out, err = run_cli(capsys, ["bench", "--target", str(smollm2_path), "--draft", str(smollm2_path),
                                    "--modes", "tree:8", "--prompts", "1", "--new-tokens", "4", "--out",
                                    str(tmp_path), "--no-plot", "--no-progress", "--cache-dir", str(tmp_path),
                                    "--backend", "cpu-static", *SMALL])
    assert rc == 0, err
    assert "# backend cpu-static: buckets rows 1,8,16 x contexts 128,256" in out and "bucket runs" in out
    assert "# tree:8+ahead: overlap: iterations" in out
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["config"]["modes"] == ["ar", "tree:8+ahead"]
    assert doc["backend"]["backend"] == "cpu-static" and doc["backend"]["timed_runs"]["bucket_runs"] > 0
    mode = doc["modes"]["tree:8+ahead"]
    assert mode["backend"]["passes"] >= 1 and mode["overlap"]["iteration_s"] > 0 and mode["mismatches"] == 0
    assert all("backend" in r and "overlap" in r for r in doc["runs"])


def lever_process(args: list[str], env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=deadline(timeout), cwd=REPO,
                          env={**os.environ, **(env or {})})


@pytest.mark.real
def test_compile_npu_writes_binaries_a_fresh_process_runs(smollm2_path, tmp_path):
    out_dir = tmp_path / "ctx"
    argv = ["-m", "lever.cli", "compile-npu", "--target", str(smollm2_path), "--buckets", "1,8", "--contexts", "64",
            "--out", str(out_dir), "--cache-dir", str(tmp_path)]
    r = lever_process(argv)
    assert r.returncode == 0, r.stderr
    assert "compile-npu: 2 compiled" in r.stdout and "0 failed" in r.stdout and "compile-npu: 100%" in r.stderr
    (key_dir,) = out_dir.iterdir()
    names = sorted(p.name for p in key_dir.iterdir())
    assert names == ["meta.json", "r1_c64_ctx.onnx", "r1_c64_ctx_qnn.bin", "r8_c64_ctx.onnx", "r8_c64_ctx_qnn.bin"]
    total = sum(p.stat().st_size for p in key_dir.iterdir())
    assert f"{total:,} bytes" in r.stdout and "soc57" in key_dir.name
    again = lever_process([*argv, "--no-progress"])
    assert again.returncode == 0 and "0 compiled" in again.stdout and "2 already there" in again.stdout
    # a fresh process loads the binaries (nothing compiled again) and every node runs on the HTP
    script = f"""
import numpy as np
from lever.gguf.config import config_from_gguf
from lever.gguf.file import GGUFFile
from lever.npu.context import BucketGraphs
from lever.npu.graph import input_shapes
cfg = config_from_gguf(GGUFFile({str(smollm2_path)!r}))
g = BucketGraphs(cfg, "qnn", 2, root={str(out_dir)!r})
s = g.session(8, 64)
feeds = {{k: np.zeros(v, dtype=np.float16) for k, v in input_shapes(cfg, 8, 64).items()}}
y, k, v = s.run(None, feeds)
assert y.shape == (8, cfg.hidden_size) and g.compiled == 0, (y.shape, g.compiled)
print("ran", s.get_providers())
"""
    r = lever_process(["-c", script])
    assert r.returncode == 0 and "ran ['QNNExecutionProvider'" in r.stdout, r.stderr[-2000:]
    other = lever_process([*argv, "--soc", "43", "--buckets", "1", "--no-progress"])
    assert other.returncode == 0, other.stderr
    assert sorted("-soc43-" in p.name for p in out_dir.iterdir()) == [False, True]


@pytest.mark.real
def test_generate_on_qnn_in_a_subprocess(smollm2_path, tmp_path):
    """One target pass on the simulated HTP (a 1-token prompt, 1 new token): the JSON
    says qnn, SoC 57, simulated (off ARM), float16, and one bucket run per layer."""
    argv = ["-m", "lever.cli", "generate", "--model", str(smollm2_path), "--prompt", "The", "--no-chat",
            "--max-new-tokens", "1", "--json", "--cache-dir", str(tmp_path)]
    r = lever_process([*argv, "--backend", "qnn", "--buckets", "1,8", "--contexts", "64"])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    b = out["backend"]
    assert b["backend"] == "qnn" and b["dtype"] == "float16" and b["soc_model"] == "57" and b["passes"] == 1
    assert b["simulated"] == (os.uname().machine == "x86_64") and b["bucket_runs"] == 30 and out["new_tokens"] == 1
