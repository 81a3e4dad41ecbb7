"""bench/bench_llamacpp.py: parsing llama.cpp's timings, the absent-binaries
message; bench/rows_vs_llamacpp.py: reading llama-bench's JSON, its absence."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_llamacpp.py"
spec = importlib.util.spec_from_file_location("bench_llamacpp", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

SPECULATIVE = """
encoded   42 tokens in    0.512 seconds, speed:   82.031 t/s
decoded   65 tokens in    4.250 seconds, speed:   15.294 t/s

n_draft   = 8
n_predict = 65
n_drafted = 72
n_accept  = 54
accept    = 75.000%

draft:

llama_perf_context_print:        load time =     300.00 ms
"""

SIMPLE = "main: decoded 64 tokens in 6.40 s, speed: 10.00 t/s\n"


def test_parse_speculative_timings():
    t = bench.parse_timings(SPECULATIVE)
    assert t == {"decoded_tokens": 65, "decode_s": 4.25, "tokens_per_s": 15.294, "prompt_tokens": 42,
                 "prefill_s": 0.512, "n_draft": 8, "n_predict": 65, "n_drafted": 72, "n_accept": 54,
                 "accept_rate": 0.75}


def test_parse_simple_timings():
    assert bench.parse_timings(SIMPLE) == {"decoded_tokens": 64, "decode_s": 6.4, "tokens_per_s": 10.0}
    assert bench.parse_timings("error: unable to load model") == {}


def test_absent_binaries_are_reported(tmp_path, capsys):
    assert bench.main(["--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "llama.cpp binaries not built: llama-speculative absent" in err and "--build" in err
    assert bench.binaries(tmp_path / "build") == {"llama-speculative": None, "llama-simple": None,
                                                  "llama-bench": None, "llama-completion": None,
                                                  "llama-tokenize": None, "llama-quantize": None}


ROWS = Path(__file__).resolve().parents[2] / "bench" / "rows_vs_llamacpp.py"


def _rows_module():
    spec = importlib.util.spec_from_file_location("rows_vs_llamacpp", ROWS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_bench_without_llama_bench_says_how_to_build(tmp_path, capsys):
    rows = _rows_module()
    assert rows.main(["--llamacpp-dir", str(tmp_path), "--models", "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert "no llama-bench under" in err and "bench_llamacpp.py --build" in err


def test_rows_bench_reads_llama_bench_json(tmp_path, monkeypatch):
    """llama_bench() takes avg_ts of the test it asked for from llama-bench's JSON."""
    rows = _rows_module()
    out = ('[{"n_prompt": 0, "n_gen": 128, "avg_ts": 14.1},'
           ' {"n_prompt": 16, "n_gen": 0, "avg_ts": 29.0}]')

    class Done:
        stdout = out

    seen = []
    monkeypatch.setattr(rows.subprocess, "run", lambda argv, **kw: seen.append(argv) or Done())
    rate, argv = rows.llama_bench(Path("llama-bench"), Path("m.gguf"), 2, 3, 16, 0)
    assert rate == 29.0 and argv == seen[0]
    assert argv[argv.index("-t") + 1] == "2" and argv[argv.index("-p") + 1] == "16"
    assert rows.llama_bench(Path("llama-bench"), Path("m.gguf"), 2, 3, 0, 128)[0] == 14.1
