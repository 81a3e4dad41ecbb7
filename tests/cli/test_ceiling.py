"""bench/ceiling.py: per-mode costs from a bench JSON, the lower hull, the perfect-overlap ceiling."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ceiling.py"
spec = importlib.util.spec_from_file_location("bench_ceiling", BENCH)
ceiling = importlib.util.module_from_spec(spec)
sys.modules["bench_ceiling"] = ceiling            # dataclasses look their module up
spec.loader.exec_module(ceiling)

RATE = 1e9                      # bytes per second
PER_PASS = 300_000_000          # bytes per pass: 0.3 s of flash


def run(mode, tokens, iterations, draft, verify, stall, wall=None):
    """One bench run; times are totals over its iterations (seconds)."""
    return {"mode": mode, "new_tokens": tokens, "iterations": iterations,
            "decode_s": wall if wall is not None else draft + verify + stall,
            "bytes_read": PER_PASS * iterations,
            "time_split_s": {"draft": draft, "verify_compute": verify, "io_stall": stall, "accept": 0.0}}


def totals(runs):
    """A bench JSON's per-mode totals ("modes"), summed over `runs` as `lever bench` sums them."""
    out = {}
    for r in runs:
        t = out.setdefault(r["mode"], {"generated_tokens": 0, "target_passes": 0, "decode_s": 0.0, "bytes_read": 0,
                                       "time_split_s": dict.fromkeys(r["time_split_s"], 0.0)})
        t["generated_tokens"] += r["new_tokens"]
        t["target_passes"] += r["iterations"]
        t["decode_s"] += r["decode_s"]
        t["bytes_read"] += r["bytes_read"]
        for k, v in r["time_split_s"].items():
            t["time_split_s"][k] += v
    return out


def bench(runs, modes):
    """A bench JSON of `runs`, its modes in the order `modes` (None: as they come)."""
    by_mode = totals(runs)
    return {"created": "test", "modes": {m: by_mode[m] for m in modes or by_mode if m in by_mode}, "runs": runs,
            "config": {"raw_read_bytes_per_s": RATE},
            "target": {"residency": {"streamed_bytes_per_pass": PER_PASS}}}


def test_mode_costs_sum_runs_before_dividing():
    """Totals over the prompts, then divided (not a mean of per-prompt ratios)."""
    doc = bench([run("chain:4", 30, 10, 1.0, 1.0, 2.0), run("chain:4", 10, 10, 1.0, 3.0, 0.0)], ["chain:4"])
    (m,) = ceiling.mode_costs(doc)
    assert m.kind == "chain"
    assert m.accepted == pytest.approx(2.0)            # 40 tokens over 20 passes
    assert m.cpu_s == pytest.approx(0.3)               # (2 + 4) s of draft + compute over 20
    assert m.stall_s == pytest.approx(0.1)
    assert m.tokens_per_s == pytest.approx(40 / 8.0)
    assert m.bytes_per_pass == pytest.approx(PER_PASS)


def test_hull_drops_points_above_a_chord_and_dominated_ones():
    pts = [(1.0, 0.5), (2.0, 0.1), (4.0, 0.5), (6.0, 0.7)]
    # (1, 0.5) costs more than (2, 0.1) for fewer tokens; (4, 0.5) lies above the chord (2,.1)-(6,.7)
    assert ceiling.lower_hull(pts) == [(2.0, 0.1), (6.0, 0.7)]
    assert ceiling.lower_hull([(1, 0.1), (3, 0.2), (4, 0.3), (6, 0.6)]) == [(1, 0.1), (3, 0.2), (4, 0.3), (6, 0.6)]


def test_ceiling_peaks_where_cpu_meets_flash():
    # on the segment (2, 0.1)-(6, 0.7) CPU reaches the 0.3 s of flash at A = 2 + 4/3
    top, a, c = ceiling.ceiling([(2.0, 0.1), (6.0, 0.7)], 0.3)
    assert a == pytest.approx(2 + 4 / 3) and c == pytest.approx(0.3)
    assert top == pytest.approx((2 + 4 / 3) / 0.3)
    assert top > max(2.0 / 0.3, 6.0 / 0.7)              # above both measured points' bounds
    # flash below every point: the best vertex by A / C
    assert ceiling.ceiling([(2.0, 0.4), (6.0, 1.0)], 0.3)[0] == pytest.approx(6.0)


def test_analyse_compares_the_ceiling_with_the_bars():
    runs = [run("ar", 10, 10, 0.0, 1.0, 2.0),                   # A 1, C 0.1
            run("chain:4", 30, 10, 1.0, 1.0, 2.0),              # A 3, C 0.2, stall 0.2
            run("chain:6", 40, 10, 1.5, 1.5, 2.0),              # A 4, C 0.3
            run("tree:16", 60, 10, 2.0, 4.0, 0.5),              # A 6, C 0.6
            run("lever", 50, 10, 1.5, 2.5, 1.0)]                # A 5, C 0.4
    doc = ceiling.analyse(bench(runs, ["ar", "chain:4", "chain:6", "tree:16", "lever"]))
    assert doc["flash_s_per_pass"] == pytest.approx(0.3)
    assert doc["ceiling"]["tokens_per_s"] == pytest.approx(4 / 0.3)          # chain:6 with no stall
    chain = doc["bars"]["chain"]
    assert chain["best_mode"] == "chain:6"                                    # 40 tokens in 5 s
    assert chain["bar_tokens_per_s"] == pytest.approx(1.5 * 8.0)
    assert chain["ceiling_over_bound_of_kind"] == pytest.approx(1.0)         # the ceiling is a chain
    assert doc["bars"]["tree"]["best_mode"] == "tree:16"
    assert [m["mode"] for m in doc["modes"]] == ["ar", "chain:4", "chain:6", "tree:16", "lever"]


def test_main_writes_json_and_plot(tmp_path, capsys):
    runs = [run("ar", 10, 10, 0.0, 1.0, 2.0), run("chain:4", 30, 10, 1.0, 1.0, 2.0),
            run("lever", 50, 10, 1.5, 2.5, 1.0)]
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(bench(runs, ["ar", "chain:4", "lever"])))
    assert ceiling.main([str(src), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "# ceiling" in out and "bar 1.5x the best chain (chain:4" in out
    doc = json.loads((tmp_path / "out" / "ceiling.json").read_text())
    assert doc["lever"]["mode"] == "lever"
    assert (tmp_path / "out" / "ceiling.png").stat().st_size > 1000


@pytest.mark.parametrize("broken, message", [
    ({"runs": [], "modes": {}}, "no run with a target pass"),
    ({"config": {"raw_read_bytes_per_s": None}}, "no raw read rate"),
    ({"modes": totals([run("beam:4", 10, 10, 1.0, 1.0, 1.0)])}, "unknown bench mode"),
])
def test_bad_bench_json_is_a_clear_error(tmp_path, capsys, broken, message):
    doc = {**bench([run("chain:4", 30, 10, 1.0, 1.0, 2.0)], None), **broken}
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(doc))
    assert ceiling.main([str(src), "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ceiling.json").exists()


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert ceiling.main([str(tmp_path / "absent.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_mode_reading_faster_than_the_raw_rate_sets_the_flash_seconds():
    # ar streams its 0.3 GB passes in 0.2 s each: 1.5 GB/s against the raw 1 GB/s
    runs = [run("ar", 10, 10, 0.0, 0.5, 1.5), run("chain:4", 30, 10, 1.0, 1.0, 2.0)]
    doc = ceiling.analyse(bench(runs, ["ar", "chain:4"]))
    assert doc["source"]["read_bytes_per_s"] == pytest.approx(1.5e9)
    assert doc["flash_s_per_pass"] == pytest.approx(0.2)
    for m in doc["modes"]:
        assert m["bound_tokens_per_s"] >= m["tokens_per_s"] - 1e-9
