"""lever.memory: RSS readings, the --memory-limit planner, the cgroup runner."""

import sys

import time

import numpy as np
import pytest

from lever.errors import CgroupUnavailableError, DramBudgetError, LeverError, MemoryLimitError
from lever.memory import cgroup, rss
from lever.memory.plan import (MIN_MARGIN_BYTES, MemoryPlan, default_margin, gguf_weight_bytes, kv_bytes,
                               store_minimum)
from lever.memory.run_plan import plan_run
from lever.model_config import ModelConfig
from lever.store.manifest import Extent, StoreManifest, TensorEntry
from lever.store.residency import kv_layer_rows, kv_layer_windows, kv_note, plan_residency
from tiny_model import needs_cgroup
from waiting import deadline

MB = 10**6
MiB = 1 << 20


# -- rss ---------------------------------------------------------------------

def test_rss_numbers_are_sane():
    s = rss.snapshot()
    assert 5 * MiB < s.rss_bytes <= s.peak_rss_bytes < 64 << 30
    assert s.anon_bytes > 0 and s.file_bytes > 0
    assert s.anon_bytes + s.file_bytes <= s.rss_bytes
    assert s.major_faults >= 0
    assert set(s.to_dict()) == {"rss_bytes", "peak_rss_bytes", "anon_bytes", "file_bytes", "major_faults"}


def test_rss_follows_an_allocation():
    before = rss.snapshot()
    block = np.ones(64 * MiB // 8)               # touched: 64 MiB anonymous
    # the kernel folds each thread's RSS counts into /proc/self/status lazily (at
    # ticks): in a process with many threads (torch's) the first read may lag
    t_end = time.monotonic() + 2.0
    during = rss.snapshot()
    while during.anon_bytes - before.anon_bytes <= 56 * MiB and time.monotonic() < t_end:
        time.sleep(0.05)
        during = rss.snapshot()
    assert during.anon_bytes - before.anon_bytes > 56 * MiB
    assert during.peak_rss_bytes >= during.rss_bytes
    del block
    assert rss.current_rss() < during.rss_bytes - 32 * MiB
    assert rss.peak_rss() > before.rss_bytes + 48 * MiB


def test_rss_without_proc_falls_back_to_ru_maxrss(tmp_path):
    s = rss.snapshot(str(tmp_path / "missing"))
    assert s.rss_bytes == s.peak_rss_bytes == rss.max_rss_bytes()
    assert s.anon_bytes == s.file_bytes == 0


def test_read_status_parses_kb_fields(tmp_path):
    p = tmp_path / "status"
    p.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\nThreads:\t3\n")
    assert rss.read_status(str(p)) == {"VmHWM": 2048 * 1024, "VmRSS": 1024 * 1024, "RssAnon": 512 * 1024}


# -- plan --------------------------------------------------------------------

def _manifest(n_layers=4, layer_bytes=8 * MiB, head_bytes=6 * MiB, cfg=None) -> StoreManifest:
    cfg = cfg or ModelConfig("llama", 1000, 64, 128, n_layers, 4, 2, 16, 1e-5, 1e4, 512, True, False)
    n_layers = cfg.n_layers
    t = (TensorEntry("mlp.up_proj.weight", 0, (128, 64), 0, 128 * 64 * 4),)
    ext, off = [], 0
    for name, n in [("layer.%d" % i, layer_bytes) for i in range(n_layers)] + [("head.0", head_bytes)]:
        ext.append(Extent(name, off, n, n, (), t, (0, 1000) if name.startswith("head") else None))
        off += n
    ext.append(Extent("globals", off, 4096, 256, (), (TensorEntry("norm.weight", 0, (64,), 0, 256),)))
    return StoreManifest(cfg, "source", off + 4096, ext)


def test_store_minimum_is_plan_residency_minimum():
    m = _manifest()
    kw = dict(dtype_bytes=2, kv_tokens=256, prefetch_depth=2, embed_cache_rows=64)
    parts = store_minimum(m, **kw)
    assert parts["ring"] == 2 * 8 * MiB and parts["globals"] == 4096
    assert parts["kv_cache"] == 256 * 4 * 2 * 2 * 16 * 2
    minimum = sum(parts.values())
    assert plan_residency(m, minimum, **kw).pinned_layers == 0
    with pytest.raises(DramBudgetError):
        plan_residency(m, minimum - 1, **kw)


def test_store_minimum_when_everything_fits_in_the_ring():
    m = _manifest(n_layers=1, layer_bytes=8 * MiB, head_bytes=4096)
    parts = store_minimum(m, prefetch_depth=2, kv_tokens=16, embed_cache_rows=0)
    assert "ring" not in parts and parts["weights"] == 8 * MiB + 4096
    assert plan_residency(m, sum(parts.values()), prefetch_depth=2, kv_tokens=16, embed_cache_rows=0).streamed == []


def test_kv_and_weight_bytes_helpers(tmp_path):
    m = _manifest()
    assert kv_bytes(m.config, 256, 2) == store_minimum(m, kv_tokens=256, dtype_bytes=2)["kv_cache"]
    from tiny_model import write_tiny_gguf
    from lever.gguf.file import GGUFFile
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    g = GGUFFile(path)
    assert 0 < gguf_weight_bytes(path) == sum(t.nbytes for t in g.tensors.values()) < path.stat().st_size


def _gemma_like() -> ModelConfig:
    """Gemma 3 270M's attention shapes: 18 layers, 5 of every 6 sliding-window
    layers (window 512 tokens), one kv head of 256; context 32,768 tokens."""
    return ModelConfig("gemma3", 1000, 64, 128, 18, 4, 1, 256, 1e-6, 1e6, 32768, True, False,
                       sliding_window=512, layer_kinds="lllllg" * 3)


GEMMA_ROW = 2 * 1 * 256 * 2      # bytes of one row of one layer: keys and values, one kv head of 256, bf16
GEMMA_LAYOUT = "3 layers x 32,768 rows + 15 sliding-window layers (window 512) x 1,536 rows"


def test_kv_bytes_count_sliding_window_layers_at_the_rows_they_hold():
    """Gemma 3 270M at 32k tokens in bf16: 576 MiB of KV if every layer kept every
    row; its 15 sliding-window layers hold K + W + 1 = 1,536 rows each (K = 511 +
    512 kept below a pass), so 118.5 MiB."""
    cfg = _gemma_like()
    assert 32768 * 18 * GEMMA_ROW == 576 * MiB
    assert kv_layer_windows(cfg) == ([512] * 5 + [0]) * 3
    assert kv_layer_rows(cfg, 32768) == ([1536] * 5 + [32768]) * 3          # passes of 512 rows: prefill chunks
    assert kv_bytes(cfg, 32768, 2) == (3 * 32768 + 15 * 1536) * GEMMA_ROW == int(118.5 * MiB)
    # a pass of 600 rows (more than W + 1) grows them to K + W + 600 rows
    assert kv_bytes(cfg, 32768, 2, pass_rows=600) == (3 * 32768 + 15 * (1023 + 512 + 600)) * GEMMA_ROW
    assert kv_bytes(cfg, 1000, 2) == 18 * 1000 * GEMMA_ROW                  # a short context: every row
    assert kv_note(cfg, 32768) == GEMMA_LAYOUT
    assert kv_note(_manifest().config, 32768) == ""                         # no sliding-window layer
    assert kv_bytes(_manifest().config, 256, 2) == 256 * 4 * 2 * 2 * 16 * 2


def test_memory_limit_plan_counts_windowed_kv():
    cfg = _gemma_like()
    m = _manifest(cfg=cfg)
    run = dict(target_store="unused", manifest=m, kv_tokens=32768, sampling=False, dtype="bfloat16",
               prefetch_depth=2, baseline_bytes=100 * MB)
    plan, budget = plan_run("2GB", tree_rows=64, **run)
    assert plan.target_minimum["kv_cache"] == (3 * 32768 + 15 * 1536) * GEMMA_ROW
    assert plan.summary()["kv_layout"] == f"target KV: {GEMMA_LAYOUT}"
    res = plan.plan_store(m, dtype_bytes=2, kv_tokens=32768, prefetch_depth=2, kv_pass_rows=512)
    assert res.fixed["kv_cache"] == plan.target_minimum["kv_cache"] and res.used_bytes <= budget
    # the largest pass sizes the windowed layers: a tree of 700 rows
    big, _ = plan_run("2GB", tree_rows=700, **run)
    assert big.target_minimum["kv_cache"] == (3 * 32768 + 15 * (1023 + 512 + 700)) * GEMMA_ROW
    # a static-shape backend keeps every row of every layer: counted in full
    static, _ = plan_run("2GB", tree_rows=64, target_windowed_kv=False, **run)
    assert static.target_minimum["kv_cache"] == 18 * 32768 * GEMMA_ROW
    # the limit's error says how the KV bytes were counted
    with pytest.raises(MemoryLimitError) as e:
        plan_run("150MB", tree_rows=64, **run)
    assert "\n" not in str(e.value)
    assert f"the KV caches reserve 124.3 MB for 32,768 tokens, target KV: {GEMMA_LAYOUT}: `--context N`" \
        in str(e.value)
    with pytest.raises(DramBudgetError) as e:
        plan_residency(m, 1, dtype_bytes=2, kv_tokens=32768, prefetch_depth=2)
    assert f"KV cache sized for 32,768 tokens ({GEMMA_LAYOUT}): `--context N`" in str(e.value)


def test_plan_arithmetic():
    target = {"globals": 1 * MB, "kv_cache": 20 * MB, "ring": 100 * MB}
    plan = MemoryPlan.build("1GB", draft_weight_bytes=300 * MB, draft_kv_bytes=10 * MB,
                            target_minimum=target, target_scratch_bytes=5 * MB,
                            margin_bytes=40 * MB, baseline_bytes=60 * MB)
    assert plan.limit_bytes == 10**9
    assert plan.reserved_bytes == (60 + 300 + 10 + 5 + 40) * MB
    assert plan.store_budget_bytes == 10**9 - plan.reserved_bytes
    assert plan.minimum_bytes == plan.reserved_bytes + 121 * MB
    s = plan.summary()
    assert s["memory_limit_bytes"] == 10**9 and s["store_budget_bytes"] == plan.store_budget_bytes
    assert s["planned_bytes"]["target_ring"] == 100 * MB and s["planned_bytes"]["margin"] == 40 * MB
    assert s["headroom_bytes"] == 10**9 - plan.minimum_bytes and s["margin_rule"] == "given"
    assert sum(s["planned_bytes"].values()) == plan.minimum_bytes


def test_plan_defaults_measure_baseline_and_margin():
    plan = MemoryPlan.build(4 << 30)
    assert plan.baseline_bytes > 5 * MiB
    assert plan.margin_bytes == default_margin(4 << 30) == int(0.05 * (4 << 30))
    assert default_margin(100 * MB) == MIN_MARGIN_BYTES
    assert "5%" in plan.summary()["margin_rule"]


def test_plan_budget_feeds_plan_residency():
    m = _manifest()
    kw = dict(kv_tokens=256, prefetch_depth=2, embed_cache_rows=64)
    plan = MemoryPlan.build(200 * MB, draft_weight_bytes=50 * MB, target_minimum=store_minimum(m, **kw),
                            baseline_bytes=30 * MB, margin_bytes=10 * MB)
    res = plan.plan_store(m, **kw)
    assert res.budget == plan.store_budget_bytes == 110 * MB
    assert res.used_bytes <= plan.store_budget_bytes and res.streamed == []


def test_limit_below_minimum_lists_the_parts():
    target = {"globals": 1 * MB, "kv_cache": 20 * MB, "ring": 100 * MB}
    with pytest.raises(MemoryLimitError) as e:
        MemoryPlan.build("400MB", draft_weight_bytes=300 * MB, draft_kv_bytes=10 * MB,
                         target_minimum=target, margin_bytes=32 * MB, baseline_bytes=60 * MB)
    msg = str(e.value)
    assert isinstance(e.value, LeverError) and isinstance(e.value, DramBudgetError)
    for part in ("memory limit 400.0 MB", "minimum of 523.0 MB", "runtime baseline 60.0 MB",
                 "draft weights 300.0 MB", "draft KV 10.0 MB", "target minimum 121.0 MB",
                 "ring 100.0 MB", "globals 1.0 MB", "kv cache 20.0 MB", "margin 32.0 MB"):
        assert part in msg, (part, msg)


def test_limit_below_minimum_names_context_with_the_kv_bytes():
    """The KV caches (sized for 2,048 tokens at least, whatever the run) are the part a user can
    lower: the error says how (`--context N`) and what they reserve now."""
    target = {"globals": 1 * MB, "kv_cache": 20 * MB, "ring": 100 * MB}
    with pytest.raises(MemoryLimitError) as e:
        MemoryPlan.build("400MB", draft_weight_bytes=300 * MB, draft_kv_bytes=10 * MB, target_minimum=target,
                         margin_bytes=32 * MB, baseline_bytes=60 * MB, kv_tokens=2048)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.endswith("; the KV caches reserve 30.0 MB for 2,048 tokens (target 20.0 MB, draft 10.0 MB): "
                        "`--context N` (lever generate, lever serve) sizes them for N tokens of prompt and output")
    with pytest.raises(MemoryLimitError) as e:                  # no draft model: the target's KV alone
        MemoryPlan.build("100MB", target_minimum=target, margin_bytes=32 * MB, baseline_bytes=60 * MB)
    assert "the KV caches reserve 20.0 MB: `--context N`" in str(e.value)
    with pytest.raises(MemoryLimitError) as e:                  # nothing of KV to lower: no hint
        MemoryPlan.build("100MB", target_minimum={"weights": 200 * MB}, margin_bytes=32 * MB, baseline_bytes=0)
    assert "--context" not in str(e.value)


def test_dram_budget_below_the_store_minimum_names_context():
    m = _manifest()
    kw = dict(dtype_bytes=2, kv_tokens=2048, prefetch_depth=2, embed_cache_rows=64)
    with pytest.raises(DramBudgetError) as e:
        plan_residency(m, sum(store_minimum(m, **kw).values()) - 1, **kw)
    assert "KV cache sized for 2,048 tokens: `--context N` (lever generate, lever serve)" in str(e.value)


def test_plan_rejects_an_unreadable_size():
    with pytest.raises(DramBudgetError, match="cannot read the size"):
        MemoryPlan.build("lots")


# -- cgroup ------------------------------------------------------------------

HOG = ("import sys; b = bytearray(int(sys.argv[1]) << 20)\n"
       "for i in range(0, len(b), 4096): b[i] = 1\nprint('done')")


@needs_cgroup
def test_cgroup_kills_a_child_over_the_cap():
    r = cgroup.run_capped([sys.executable, "-c", HOG, "300"], 100 * MiB, timeout_s=deadline(60))
    assert r.oom_killed and r.rc == -9 and not r.timed_out
    assert r.peak_bytes <= 100 * MiB and r.peak_bytes > 50 * MiB
    assert r.limit_bytes == 100 * MiB and r.cgroup_version in (1, 2)
    assert "done" not in r.stdout_tail


@needs_cgroup
def test_cgroup_child_under_the_cap_runs_and_the_cgroup_is_removed():
    ctl = cgroup.find_controller()
    before = {p.name for p in ctl.parent.iterdir() if p.name.startswith("lever-")}
    r = cgroup.run_capped([sys.executable, "-c", HOG, "20"], 100 * MiB, timeout_s=deadline(60))
    assert r.rc == 0 and not r.oom_killed and r.stdout_tail == "done\n"
    assert 20 * MiB < r.peak_bytes < 100 * MiB
    assert r.major_faults >= 0 and r.wall_s > 0
    assert {p.name for p in ctl.parent.iterdir() if p.name.startswith("lever-")} == before


@needs_cgroup
def test_cgroup_timeout_kills_the_child():
    r = cgroup.run_capped([sys.executable, "-c", "import time; time.sleep(30)"], 100 * MiB,
                          timeout_s=0.5, drop_caches=False)
    assert r.timed_out and r.rc == -9 and not r.oom_killed and r.wall_s < 10


def test_uncapped_run_reports_peak_and_output():
    r = cgroup.run_uncapped([sys.executable, "-c", HOG + "\nimport sys; print('err', file=sys.stderr)", "40"])
    assert r.rc == 0 and r.stdout_tail == "done\n" and r.stderr_tail == "err\n"
    assert r.peak_bytes > 40 * MiB and r.limit_bytes is None and not r.oom_killed


def test_no_memory_controller_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup, "_is_root", lambda: True)
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("cpu io\n")
    with pytest.raises(CgroupUnavailableError, match=r"no memory cgroup controller.*\[cpu io\].*no cgroup v1"):
        cgroup.run_capped(["true"], 100 * MiB, root=tmp_path, drop_caches=False)


def test_not_root_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup, "_is_root", lambda: False)
    with pytest.raises(CgroupUnavailableError, match="needs root"):
        cgroup.run_capped(["true"], 100 * MiB, root=tmp_path)


def test_fake_v1_and_v2_roots_are_detected(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup, "_is_root", lambda: True)
    v1 = tmp_path / "a" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("max\n")
    assert cgroup.find_controller(tmp_path / "a") == cgroup.MemoryController(1, v1)
    v2 = tmp_path / "b"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory io\n")
    (v2 / "cgroup.subtree_control").write_text("")
    ctl = cgroup.find_controller(v2)
    assert ctl == cgroup.MemoryController(2, v2) and ctl.files["peak"] == "memory.peak"
    assert (v2 / "cgroup.subtree_control").read_text() == "+memory"


def test_rss_module_does_not_import_torch():
    import subprocess
    code = "import sys, lever.memory.rss, lever.memory.cgroup; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
