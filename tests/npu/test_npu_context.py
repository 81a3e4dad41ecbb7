"""QNN context binaries (lever.npu.context) and the static backends' errors.

- Context binaries compiled in one process load and run in a fresh process
  (no recompilation: the binary is what a phone would load), and give the
  CPU EP's outputs within float16 tolerance.
- A context directory built for another model, graph, SoC or onnxruntime /
  QNN version is refused with one line saying which field differs.
- Missing packages, an unknown backend, an unsupported SoC or HTP
  architecture: one-line errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from lever.errors import LeverError
from lever.model_config import ModelConfig
from lever.npu import runtime
from lever.npu.context import META, BucketGraphs, check_meta, context_meta
from lever.npu.runtime import NpuError, QnnTarget
from waiting import deadline

CFG = ModelConfig(arch="llama", vocab_size=100, hidden_size=64, intermediate_size=128, n_layers=2, n_heads=8,
                  n_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_context=512,
                  tie_word_embeddings=False, attention_bias=False)


RUN_ONE_BUCKET = textwrap.dedent("""
    import json, sys
    import numpy as np
    from lever.model_config import ModelConfig
    from lever.npu.context import BucketGraphs
    from lever.npu.graph import input_shapes
    cfg = ModelConfig(**json.loads(sys.argv[2]))
    graphs = BucketGraphs(cfg, sys.argv[3], root=sys.argv[1])
    if sys.argv[4] == "compile":
        graphs.compile_all([4], [16])
    rng = np.random.default_rng(0)
    feeds = {k: (rng.standard_normal(s) * 0.3).astype(graphs.dtype) for k, s in input_shapes(cfg, 4, 16).items()}
    feeds["mask"] = np.zeros((4, 20), graphs.dtype)
    y = graphs.session(4, 16).run(None, feeds)[0]
    print(json.dumps({"compiled": graphs.compiled, "y": y.astype(float).round(4).tolist(),
                      "providers": graphs.session(4, 16).get_providers()}))
""")


def run_bucket(root, backend: str, action: str) -> dict:
    cfg = json.dumps(CFG.__dict__)
    out = subprocess.run([sys.executable, "-c", RUN_ONE_BUCKET, str(root), cfg, backend, action],
                         capture_output=True, text=True, timeout=deadline(300))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_context_binaries_load_and_run_in_a_fresh_process(tmp_path):
    import numpy as np
    made = run_bucket(tmp_path, "qnn", "compile")
    assert made["compiled"] == 1
    [directory] = [p for p in tmp_path.iterdir() if p.is_dir()]
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["meta.json", "r4_c16_ctx.onnx", "r4_c16_ctx_qnn.bin"], names
    loaded = run_bucket(tmp_path, "qnn", "load")               # a fresh process: loads, compiles nothing
    assert loaded["compiled"] == 0 and loaded["providers"][0] == "QNNExecutionProvider"
    cpu = run_bucket(tmp_path, "cpu-static", "load")
    a, b, c = (np.asarray(r["y"]) for r in (made, loaded, cpu))
    assert np.array_equal(a, b)
    assert np.abs(b - c).max() <= 2e-2 * max(1.0, np.abs(c).max())


def test_stale_context_directories_are_refused(tmp_path):
    target = QnnTarget()
    want = context_meta(CFG, target)
    (tmp_path / META).write_text(json.dumps(want))
    check_meta(tmp_path, want)                                  # the right one passes
    for field, value in [("model", {**want["model"], "hidden": 896}), ("soc_model", "43"),
                         ("versions", {**want["versions"], "onnxruntime": "1.20.0"}),
                         ("graph_digest", "0" * 16)]:
        (tmp_path / META).write_text(json.dumps({**want, field: value}))
        with pytest.raises(NpuError, match=f"built for {field} .*run lever compile-npu again"):
            check_meta(tmp_path, want)
    (tmp_path / META).write_text("{not json")
    with pytest.raises(NpuError, match="unreadable"):
        check_meta(tmp_path, want)
    (tmp_path / META).unlink()
    with pytest.raises(NpuError, match="not a Lever context directory"):
        check_meta(tmp_path, want)


def test_a_binary_for_another_model_is_not_loaded(tmp_path):
    graphs = BucketGraphs(CFG, "qnn", root=tmp_path)
    graphs.compile(4, 16)
    meta = graphs.directory / META
    doctored = json.loads(meta.read_text())
    doctored["versions"]["qnn"] = "2.40.0"
    meta.write_text(json.dumps(doctored))
    with pytest.raises(NpuError, match="built for versions"):
        BucketGraphs(CFG, "qnn", root=tmp_path).session(4, 16)


@pytest.mark.parametrize("soc, arch, message", [("99", "", "unsupported SoC model '99'"),
                                                ("57", "73", "has HTP architecture v75, not v73")])
def test_unsupported_soc_or_arch(soc, arch, message):
    with pytest.raises(NpuError, match=message):
        QnnTarget(soc, arch)


def test_known_socs_resolve_their_architecture():
    assert QnnTarget("43").htp_arch == "73" and QnnTarget("69", "79").chip.startswith("SM8750")
    assert QnnTarget().provider_options()["soc_model"] == "57"


def test_unknown_backend_is_refused():
    with pytest.raises(NpuError, match="unknown static backend 'npu'"):
        BucketGraphs(CFG, "npu")


def test_missing_packages_are_named(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_qnn(name, *args, **kwargs):
        if name.startswith("onnxruntime_qnn") or (name == "onnxruntime" and block_ort):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_qnn)
    monkeypatch.setattr(runtime, "_qnn_devices", None)
    block_ort = False
    with pytest.raises(NpuError, match="needs the onnxruntime-qnn package, which is not installed"):
        runtime.qnn_devices()
    block_ort = True
    with pytest.raises(NpuError, match="need onnxruntime, which is not installed"):
        runtime.onnxruntime()
    assert issubclass(NpuError, LeverError)
