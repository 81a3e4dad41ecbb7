"""bench/bench_llamacpp.py: parsing llama.cpp's timings, the absent-binaries message."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_llamacpp.py"
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
    assert bench.binaries(tmp_path / "build") == {"llama-speculative": None, "llama-simple": None}
