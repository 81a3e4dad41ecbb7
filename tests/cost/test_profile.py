"""The on-device profile (`lever profile`), its cache, and the cost model built from it."""

import json
import time

import numpy as np
import pytest

from lever.cli import main
from lever.cost import measure as measure_mod
from lever.cost.cost_model import CostModel, interpolate
from lever.cost.device_profile import VERSION, DeviceProfile, Stage
from lever.cost.profile import load_or_measure, measure_profile, profile_key, profile_path
from lever.errors import ProfileError, ReadLimitError
from lever.masks import causal_mask
from lever.model.streamed_decoder import StreamedDecoder
from lever.reference.torch_model import load_gguf_torch
from lever.store.flash_reader import DEFAULT_QUEUE_DEPTH
from lever.values import parse_rate
from test_store import minimum_budget

pytestmark = pytest.mark.real

GRID = dict(n_grid=[1, 4, 16], draft_grid=[1, 4], context_tokens=16, repeats=3)


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return load_gguf_torch(smollm2_path, "bfloat16")[0]


@pytest.fixture(scope="module")
def half_budget(smol_store):
    """A budget that pins some layers (the tail) and streams the rest."""
    from lever.store.manifest import StoreManifest
    return minimum_budget(smol_store) + StoreManifest.load(smol_store).weights_bytes // 2


@pytest.fixture(scope="module")
def streamed(smol_store, half_budget):
    model = StreamedDecoder(smol_store, half_budget)
    yield model
    model.close()


def resident_key(smol, smollm2_path, **kw):
    args = dict(target_id=smollm2_path, draft_id=smollm2_path, kernels="native", reader_backend="auto",
                read_limit_bytes_per_s=0.0, dtype="bfloat16")
    return profile_key(smol, smol, **{**args, **kw})


def streamed_key(model, smollm2_path, **kw):
    args = dict(target_id=model.store_dir, draft_id=smollm2_path, kernels="native", reader_backend="auto",
                read_limit_bytes_per_s=0.0, dtype="bfloat16")
    return profile_key(model, model, **{**args, **kw})


# -- the stage_times hook --------------------------------------------------------

def forward(model, ids, cache):
    n = cache.length
    t = len(ids)
    return model(np.array(ids, dtype=np.int64), np.arange(n, n + t), causal_mask(t, n), cache)


@pytest.mark.parametrize("which", ["resident", "streamed"])
def test_stage_times_hook_is_exact_and_complete(which, smol, streamed):
    model = smol if which == "resident" else streamed
    ids = [1, 100, 2000, 300, 42]
    ref_cache, hook_cache = model.new_cache(), model.new_cache()
    ref = np.concatenate([forward(model, ids, ref_cache), forward(model, [7, 8], ref_cache)])
    model.stage_times = []
    try:
        got = np.concatenate([forward(model, ids, hook_cache), forward(model, [7, 8], hook_cache)])
        times = model.stage_times
    finally:
        model.stage_times = None
    assert np.array_equal(got, ref)
    one_pass = ["embed"] + [f"layer.{i}" for i in range(model.config.n_layers)] + ["head"]
    assert [name for name, _ in times] == one_pass * 2
    assert all(s >= 0 for _, s in times)


# -- measuring -------------------------------------------------------------------

def test_resident_profile(smol, smollm2_path):
    p = measure_profile(smol, smol, resident_key(smol, smollm2_path), progress=False, **GRID)
    assert [s.name for s in p.stages] == [f"layer.{i}" for i in range(smol.config.n_layers)] + ["head"]
    assert all(s.io_s == 0.0 and s.io_bytes == 0 and not s.streamed for s in p.stages)
    assert all(len(s.compute_s) == 3 and min(s.compute_s) > 0 for s in p.stages)
    assert p.n_grid == [1, 4, 16] and len(p.embed_s) == 3
    assert p.draft_grid == [1, 4] and len(p.draft_s) == 2 and min(p.draft_s) > 0
    assert p.prefetch_depth == 0 and not p.fixed_shapes and p.iteration_overhead_s > 0
    assert len(p.pass_spread) == 3 and len(p.draft_spread) == 2 and min(p.pass_spread + p.draft_spread) >= 0
    # every point of grids this small is re-checked at the end
    assert [(r["curve"], r["n"]) for r in p.validation] == [("target", 1), ("target", 4), ("target", 16),
                                                              ("draft", 1), ("draft", 4)]
    assert all(r["checks"] and r["final_s"] > 0 for r in p.validation) and p.rejected_runs >= 0
    assert DeviceProfile.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert CostModel(p).io_share(1) == pytest.approx(0.0, abs=1e-12)     # (summation order)


def test_streamed_profile(streamed, smollm2_path):
    p = measure_profile(streamed, streamed, streamed_key(streamed, smollm2_path), progress=False, **GRID)
    m = streamed.manifest
    assert [s.name for s in p.stages] == [e.name for e in m.layers + m.head_parts]
    assert [s.kind for s in p.stages] == ["layer"] * len(m.layers) + ["head"] * len(m.head_parts)
    streamed_names = {e.name for e in streamed.plan.streamed}
    pinned_names = {e.name for e in streamed.plan.pinned}
    assert streamed_names and pinned_names & {s.name for s in p.stages}
    lengths = {e.name: e.length for e in m.extents}
    for s in p.stages:
        if s.name in streamed_names:
            assert s.io_s > 0 and s.io_bytes == lengths[s.name]
        else:
            assert s.io_s == 0.0 and s.io_bytes == 0
    assert p.prefetch_depth == streamed.plan.prefetch_depth
    assert p.io_bytes_per_pass == streamed.plan.streamed_bytes_per_pass
    assert 0 < CostModel(p).io_share(1) < 1


# -- the cache ---------------------------------------------------------------------

@pytest.fixture
def counted(monkeypatch):
    """Counts calls of the measurement (load_or_measure goes through the module)."""
    calls = []
    real = measure_mod.measure_profile

    def wrapper(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(measure_mod, "measure_profile", wrapper)
    return calls


SMALL = dict(n_grid=[1, 2], draft_grid=[1], context_tokens=8, repeats=1)


def test_cache_hit_does_not_measure(smol, smollm2_path, tmp_path, counted, capsys):
    key = resident_key(smol, smollm2_path)
    first = load_or_measure(smol, smol, key, cache_dir=tmp_path, **SMALL)
    path = profile_path(first.key, tmp_path)
    assert path.is_file() and path.parent == tmp_path / "profiles" and len(counted) == 1
    again = load_or_measure(smol, smol, key, cache_dir=tmp_path, **SMALL)
    assert len(counted) == 1 and again.to_json() == first.to_json()
    assert "using the cached profile" in capsys.readouterr().err
    load_or_measure(smol, smol, key, cache_dir=tmp_path, force=True, **SMALL)
    assert len(counted) == 2
    load_or_measure(smol, smol, key, cache_dir=tmp_path, **{**SMALL, "n_grid": [1, 3]})   # other grid
    assert len(counted) == 3


def test_every_key_change_is_another_file(streamed, smollm2_path, smol, tmp_path):
    base = streamed_key(streamed, smollm2_path)
    variants = [base,
                streamed_key(streamed, smollm2_path, kernels="torch"),
                streamed_key(streamed, smollm2_path, read_limit_bytes_per_s=200e6),
                streamed_key(streamed, smollm2_path, dtype="float32"),
                streamed_key(streamed, smollm2_path, reader_backend="pread"),
                resident_key(smol, smollm2_path)]
    deeper = StreamedDecoder(streamed.store_dir, streamed.plan.budget, queue_depth=3)
    try:
        variants.append(streamed_key(deeper, smollm2_path))      # another reader queue depth
    finally:
        deeper.close()
    paths = {profile_path(k, tmp_path) for k in variants}
    assert len(paths) == len(variants)
    assert profile_path(streamed_key(streamed, smollm2_path), tmp_path) == profile_path(base, tmp_path)
    assert base["target"]["kind"] == "store" and base["target"]["format"] == "source"
    assert base["memory"]["pinned"] == sorted(e.name for e in streamed.plan.pinned)
    assert base["backend"]["read_queue_depth"] == DEFAULT_QUEUE_DEPTH
    assert variants[-1]["backend"]["read_queue_depth"] == 3
    assert resident_key(smol, smollm2_path)["target"]["kind"] == "gguf"
    with pytest.raises(ProfileError):
        streamed_key(streamed, smollm2_path, kernels="fast")


def test_huge_pages_are_in_the_key(streamed, smollm2_path, tmp_path, monkeypatch):
    """Slots on 4 KiB pages read at another rate than slots on huge pages: another profile."""
    base = streamed_key(streamed, smollm2_path)
    assert base["backend"]["read_huge_pages"] == (streamed.reader.stats()["huge_page_bytes"] > 0)
    monkeypatch.setenv("LEVER_HUGE_PAGES", "0")
    small = StreamedDecoder(streamed.store_dir, streamed.plan.budget)
    try:
        key = streamed_key(small, smollm2_path)
    finally:
        small.close()
    assert key["backend"]["read_huge_pages"] is False
    assert (profile_path(key, tmp_path) != profile_path(base, tmp_path)) == base["backend"]["read_huge_pages"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other key", "other version"])
def test_damaged_cache_file_is_measured_again(damage, smol, smollm2_path, tmp_path, counted, capsys):
    key = resident_key(smol, smollm2_path)
    first = load_or_measure(smol, smol, key, cache_dir=tmp_path, progress=False, **SMALL)
    path = profile_path(first.key, tmp_path)
    text = path.read_text()
    data = json.loads(text)
    if damage == "garbage":
        path.write_text("not json")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "other key":
        data["key"]["machine"]["cpu"] = "some other CPU"
        path.write_text(json.dumps(data))
    else:
        data["version"] = VERSION + 1
        path.write_text(json.dumps(data))
    capsys.readouterr()
    again = load_or_measure(smol, smol, key, cache_dir=tmp_path, progress=False, **SMALL)
    assert len(counted) == 2
    assert "warning: ignoring the cached profile" in capsys.readouterr().err
    assert again.key == first.key
    assert DeviceProfile.from_json(json.loads(path.read_text())).to_json() == again.to_json()


# -- the cost model on synthetic profiles -------------------------------------------

def synthetic(stages, depth=2, n_grid=(1,), embed=None, draft=((1,), (0.001,)), fixed=False):
    """stages: (io_s, compute_s list aligned with n_grid or a scalar); io_s > 0 = streamed."""
    n_grid = list(n_grid)
    out = []
    for i, (io, c) in enumerate(stages):
        c = [float(c)] * len(n_grid) if np.isscalar(c) else list(c)
        out.append(Stage(f"layer.{i}", "layer", float(io), 1000 if io > 0 else 0, c))
    return DeviceProfile(key={}, n_grid=n_grid, stages=out, embed_s=list(embed or [0.0] * len(n_grid)),
                         draft_grid=list(draft[0]), draft_s=list(draft[1]), iteration_overhead_s=0.002,
                         prefetch_depth=depth, fixed_shapes=fixed)


def one_pass(stages, depth, **kw) -> float:
    return float(CostModel(synthetic(stages, depth, **kw)).verify_s(1)[0])


def test_depth_one_serialises_reads_and_compute():
    stages = [(1.0, 0.5), (2.0, 0.25), (3.0, 0.125)]
    assert one_pass(stages, 1) == pytest.approx(6.875, rel=1e-12)       # Σ(io + c)


def test_no_io_is_the_sum_of_compute():
    stages = [(0.0, 0.5), (0.0, 0.25), (0.0, 1.0)]
    for depth in (0, 1, 4):
        assert one_pass(stages, depth) == pytest.approx(1.75, rel=1e-12)


def test_deep_prefetch_io_bound_is_the_sum_of_reads():
    stages = [(1.0, 0.5), (2.0, 0.25), (3.0, 0.125)]
    assert one_pass(stages, 3) == pytest.approx(6.0, rel=1e-12)         # Σ io
    assert one_pass(stages, 8) == pytest.approx(6.0, rel=1e-12)


def test_uniform_layers_two_slots_match_the_design_formula():
    """The design formula (README): Σ max(IO, C) for uniform layers and a two-slot ring."""
    for io, c in ((1.0, 0.5), (0.5, 1.0)):
        assert one_pass([(io, c)] * 4, 2) == pytest.approx(4 * max(io, c), rel=1e-12)


def test_pinned_tail_hides_the_next_pass_reads():
    """Two streamed layers (read 1 s, compute 0.5 s), then three pinned (1 s each):
    the next pass's two reads land during the pinned tail, so a pass is Σ C = 4 s
    (Σ max(IO, C) would say 5 s, a one-slot ring 5 s as well)."""
    stages = [(1.0, 0.5), (1.0, 0.5), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)]
    assert one_pass(stages, 2) == pytest.approx(4.0, rel=1e-12)
    assert one_pass(stages, 1) == pytest.approx(5.0, rel=1e-12)         # the 2nd read waits for slot 1
    model = CostModel(synthetic(stages, 2))
    assert model.io_share(1) == 0.0 and model.io_floor_s == 2.0


def test_io_share_and_embedding():
    model = CostModel(synthetic([(1.0, 0.5), (3.0, 0.5)], 1, embed=[0.25]))
    assert model.verify_s(1)[0] == pytest.approx(5.25, rel=1e-12)
    assert model.io_share(1) == pytest.approx(4.0 / 5.25, rel=1e-12)


def test_interpolation_and_extrapolation():
    grid = [1, 4, 16]
    p = synthetic([(0.0, [1.0, 2.0, 6.0])], 1, n_grid=grid)
    v = CostModel(p).verify_s(24)
    assert v[0] == pytest.approx(1.0) and v[3] == pytest.approx(2.0) and v[15] == pytest.approx(6.0)
    assert v[1] == pytest.approx(1 + 1 / 3) and v[9] == pytest.approx(4.0)
    assert v[23] == pytest.approx(6.0 + 8 * 4 / 12)                      # slope of the last segment
    # a dip in the measurements is noise: the curve is made non-decreasing (pooled with the point before,
    # by relative error; the fit itself is tested in test_profile_fit.py)
    pooled = (2.0 / 2.0**2 + 1.8 / 1.8**2) / (1 / 2.0**2 + 1 / 1.8**2)
    assert list(interpolate([1, 4, 8], [2.0, 1.8, 3.0], np.array([1.0, 2.5, 4.0, 6.0]))) == \
        pytest.approx([pooled, pooled, pooled, (pooled + 3.0) / 2])
    assert list(interpolate([1, 4], [2.0, 1.0], np.array([8.0]))) == [1.5]   # never extrapolated downwards


def test_verify_time_is_non_decreasing_when_compute_is():
    rng = np.random.default_rng(1)
    grid = [1, 2, 4, 8, 16, 32, 64]
    stages = []
    for i in range(12):
        curve = np.cumsum(rng.uniform(0, 0.01, len(grid))) + 0.001
        stages.append((float(rng.uniform(0.002, 0.02)) if i % 3 else 0.0, list(curve)))
    for depth in (1, 2, 4):
        v = CostModel(synthetic(stages, depth, n_grid=grid)).verify_s(100)
        assert np.all(np.diff(v) >= -1e-15)


def test_fixed_shapes_are_a_step_function():
    p = synthetic([(0.0, [1.0, 2.0, 5.0])], 1, n_grid=[1, 4, 16], fixed=True)
    v = CostModel(p).verify_s(40)
    assert list(v[:16]) == [1.0, 2.0, 2.0, 2.0] + [5.0] * 12
    assert v[16] == 6.0 and v[19] == 7.0 and v[31] == 10.0 and v[32] == 11.0   # 16 + rest


def test_draft_interpolation_and_scaling():
    p = synthetic([(1.0, 1.0)], 2, draft=((1, 4), (0.01, 0.04)))
    model = CostModel(p)
    assert list(model.draft_s(6)) == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05, 0.06])
    s = model.scaled(2.0, 0.5)
    assert s.verify_s(3) == pytest.approx(2 * model.verify_s(3))
    assert s.draft_s(4) == pytest.approx(0.5 * model.draft_s(4))
    assert s.scaled(1.5, 1.0).verify_factor == 3.0
    assert model.iteration_overhead_s == 0.002
    summary = model.summary()
    assert set(summary["pass_s"]) == {1, 16, 64, 256} and summary["streamed_stages"] == 1


def test_inconsistent_profile_is_refused():
    p = synthetic([(0.0, [1.0, 2.0])], 1, n_grid=[1, 4])
    p.stages[0].compute_s = [1.0]
    with pytest.raises(ProfileError, match="entries"):
        CostModel(p)
    with pytest.raises(ProfileError, match="increasing"):
        CostModel(synthetic([(0.0, 1.0)], 1, n_grid=[4, 4]))


# -- the read limit --------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("200MB/s", 200e6), ("1.5GiB/s", 1.5 * 2**30), ("512M", 512 * 2**20), ("250000000", 250e6),
    ("0", 0.0), (None, 0.0), ("3 kB / s", 3000.0), (1e6, 1e6)])
def test_parse_rate(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["fast", "-5MB/s", "10 MB/h", "inf", "1e999"])
def test_parse_rate_rejects_garbage(text):
    with pytest.raises(ReadLimitError, match="read limit"):
        parse_rate(text)


def test_read_limit_caps_the_reader(smol_store, capsys):
    cap = 20e6
    model = StreamedDecoder(smol_store, minimum_budget(smol_store), max_read_bytes_per_s=cap)
    try:
        assert model.report()["read_limit_bytes_per_s"] == cap
        model.settle()
        e = model.plan.streamed[0]
        t0 = time.perf_counter()
        model.reader.read(e.offset, e.length)
        assert time.perf_counter() - t0 >= 0.95 * e.length / cap
    finally:
        model.close()
    assert main(["generate", "--target-store", str(smol_store), "--read-limit", "fast", "--prompt", "x"]) == 2
    assert "cannot read the read limit 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize("depth", [None, 3])
def test_read_queue_depth_reaches_the_reader(smol_store, half_budget, depth, capsys):
    """`--read-queue-depth N` is the depth the streamed target's reader runs with."""
    flag = [] if depth is None else ["--read-queue-depth", str(depth)]
    assert main(["generate", "--target-store", str(smol_store), "--dram-budget", str(half_budget), "--prompt", "hi",
                 "--max-new-tokens", "1", "--json", *flag]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["flash"]["reader"]["queue_depth"] == (DEFAULT_QUEUE_DEPTH if depth is None else depth)
    assert out["flash"]["bytes_read"] > 0


# -- lever profile -----------------------------------------------------------------

def test_cli_profile_writes_the_cache_and_a_plot(smollm2_path, tmp_path, capsys):
    png = tmp_path / "profile.png"
    argv = ["profile", "--target", str(smollm2_path), "--draft", str(smollm2_path), "--max-n", "3",
            "--cache-dir", str(tmp_path), "--no-progress"]
    assert main(argv + ["--plot", str(png)]) == 0
    out = capsys.readouterr().out
    files = list((tmp_path / "profiles").glob("*.json"))
    assert len(files) == 1 and f"profile: {files[0]}" in out and "pass (predicted)" in out
    assert "spread (robust SD / median): pass n=1 " in out
    assert all(f"validation target n={n}: " in out for n in (1, 2, 3)) and "validation draft f=4: " in out
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    profile = DeviceProfile.from_json(json.loads(files[0].read_text()))
    assert profile.n_grid == [1, 2, 3]
    assert main(argv + ["--json"]) == 0                                   # from the cache
    got = json.loads(capsys.readouterr().out)
    assert got.pop("memory")["peak_rss_bytes"] > 0                        # the run's own RSS figures
    assert got == profile.to_json()


def test_cli_profile_refuses_ngram(capsys):
    assert main(["profile", "--draft", "ngram"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lever: error:") and "ngram" in err and "draft model" in err
