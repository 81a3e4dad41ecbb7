"""Every command-line input either runs or ends with exactly one `lever: error:`
line on stderr and exit status 2 -- no traceback, no hang. A matrix of bad
values for every option of generate, bench, profile, convert and models runs
through `lever.cli.main` in-process (each bounded by a timer); invalid UTF-8
on stdin and in argv go through a real process; a few good inputs, boundary
values included, run to the end."""

import io
import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from lever.cli import main
from lever.commands.limits import MAX_PROMPT_BYTES, MIN_READ_RATE

LIMIT_S = 60                   # no single case may take longer (a hang fails instead of blocking the suite)
BIG = "9" * 400                # a 400-digit number


class Hang(BaseException):
    """Raised by the timer; a BaseException so that no handler in Lever swallows it."""


@contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(capsys, argv: list[str], limit: float = LIMIT_S) -> tuple[int, str, str]:
    with time_limit(limit):
        rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_one_error_line(rc: int, err: str, *fragments: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("lever: error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """Placeholders of the matrix: files and directories of every kind (none is written to)."""
    tmp_path = tmp_path_factory.mktemp("cli-inputs")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file.txt").write_text("not a model\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text(" \n\t\n")
    (tmp_path / "huge.txt").write_bytes(b"a" * (MAX_PROMPT_BYTES + 1))
    return {"dir": str(tmp_path / "dir"), "file": str(tmp_path / "file.txt"),
            "latin1": str(tmp_path / "latin1.txt"), "empty": str(tmp_path / "empty.txt"),
            "blank": str(tmp_path / "blank.txt"), "huge": str(tmp_path / "huge.txt"),
            "missing": str(tmp_path / "missing"), "missing_dir_file": str(tmp_path / "missing" / "x.png")}


GEN = ["generate", "--prompt", "hi"]
BENCH = ["bench", "--quick"]
PROFILE = ["profile", "--draft", "smollm2-135m"]
CONVERT = ["convert", "smollm2-135m"]

# (argv, fragments of the error line); {name} is replaced by paths[name]
BAD = [
    # the command line itself
    ([], "COMMAND"),
    (["nope"], "invalid choice"),
    (["--bogus"], "COMMAND"),
    (["generate"], "--prompt"),
    ([*GEN, "--bogus"], "unrecognized arguments: --bogus", "`lever generate --help`"),
    (["models", "extra"], "unrecognized arguments: extra", "`lever models --help`"),
    ([*GEN, "--max-new-tokens"], "--max-new-tokens"),
    ([*GEN, "--prompt-file", "{file}"], "not allowed with"),
    ([*GEN, "--dtype", "float16"], "--dtype"),
    ([*GEN, "--kernels", "cuda"], "--kernels"),
    ([*GEN, "--reader", "mmap"], "--reader"),
    ([*GEN, "--mode", "fast"], "--mode"),
    # integers
    *[([*GEN, "--max-new-tokens", v], "--max-new-tokens") for v in ["x", "-1", "1.5", "", "2**10", "1048577", BIG]],
    *[([*GEN, "--draft-len", v], "--draft-len") for v in ["0", "65", "x"]],
    *[([*GEN, "--tree-budget", v], "--tree-budget") for v in ["0", "1025", "100000", "1e3"]],
    *[([*GEN, "--tree-topk", v], "--tree-topk") for v in ["0", "65"]],
    *[([*GEN, "--tree-depth", v], "--tree-depth") for v in ["0", "65"]],
    *[([*GEN, "--lever-max-nodes", v], "--lever-max-nodes") for v in ["0", "1025"]],
    *[([*GEN, "--lever-max-depth", v], "--lever-max-depth") for v in ["0", "65"]],
    *[([*GEN, "--lever-topk", v], "--lever-topk") for v in ["0", "65"]],
    *[([*GEN, "--prefetch-depth", v], "--prefetch-depth") for v in ["0", "-1", "17"]],
    *[([*GEN, "--top-k", v], "--top-k") for v in ["-1", "2147483649", "x"]],
    *[([*GEN, "--seed", v], "--seed") for v in ["-1", str(2**63), str(2**64), "2**64", "1.0", BIG]],
    # floats
    *[([*GEN, "--temperature", v], "--temperature")
      for v in ["1e-300", "0.0009", "inf", "nan", "-1", "100.5", "abc", BIG]],
    *[([*GEN, "--top-p", v], "--top-p") for v in ["0", "1e-300", "1.5", "nan", "-0.5", "inf"]],
    *[([*GEN, "--call-cost-ms", v], "--call-cost-ms") for v in ["-1", "inf", "nan"]],
    *[([*GEN, "--retry-deadline", v], "--retry-deadline") for v in ["-1", "inf", "1e9"]],
    # sizes and rates
    *[([*GEN, "--dram-budget", v], "--dram-budget")
      for v in [BIG, "1e400", "0", "-5MB", "5XB", "abc", "0.5", "17TiB", ""]],
    *[([*GEN, "--read-limit", v], "--read-limit")
      for v in ["1", "999999", f"{MIN_READ_RATE - 1:.0f}", "1B/s", "1MB/s", "0.5MB/s", "-1MB/s", "inf", "nan",
                "2TB/s", "fast", BIG]],
    *[([*GEN, "--read-queue-depth", v], "--read-queue-depth") for v in ["0", "-1", "257", "1.5", "x", BIG]],
    # paths
    ([*GEN, "--cache-dir", "{file}"], "--cache-dir"),
    ([*GEN, "--target-store", "{missing}"], "no such store directory", "lever convert"),
    ([*GEN, "--target-store", "{file}"], "not a directory"),
    ([*GEN, "--model", "{missing}"], "unknown model"),
    ([*GEN, "--model", "{dir}"], "config.json"),
    ([*GEN, "--model", "{file}"], "not a GGUF file"),
    ([*GEN, "--remote", "http://127.0.0.1:9", "--draft", "smollm2-135m", "--token-file", "{missing}"],
     "--token-file"),
    # empty names, paths and URLs (never read as "not given")
    *[([*GEN, opt, v], opt, "must not be empty")
      for opt in ["--model", "--draft", "--remote", "--token-file"] for v in ["", " "]],
    ([*BENCH, "--draft", ""], "--draft", "must not be empty"),
    ([*BENCH, "--target", ""], "--target", "must not be empty"),
    ([*BENCH, "--prompt-set", ""], "--prompt-set", "must not be empty"),
    ([*BENCH, "--categories", "code", ""], "--categories", "must not be empty"),
    (["profile", "--draft", ""], "--draft", "must not be empty"),
    (["convert", "", "--out", "{missing}"], "model", "must not be empty"),
    (["models", "--assemble", ""], "--assemble", "must not be empty"),
    # prompts
    (["generate", "--prompt", ""], "the prompt is empty"),
    (["generate", "--prompt", " \n "], "the prompt is empty"),
    (["generate", "--prompt", "bad \udcff byte"], "not UTF-8"),
    (["generate", "--prompt-file", "{missing}"], "no such file"),
    (["generate", "--prompt-file", "{dir}"], "is a directory"),
    (["generate", "--prompt-file", "{latin1}"], "not UTF-8", "offset 3"),
    (["generate", "--prompt-file", "{empty}"], "the prompt is empty"),
    (["generate", "--prompt-file", "{blank}"], "the prompt is empty"),
    (["generate", "--prompt-file", "{huge}"], "larger than 16 MiB"),
    # combinations refused before anything loads
    ([*GEN, "--mode", "chain"], "needs --draft"),
    ([*GEN, "--mode", "lever", "--draft", "ngram"], "needs a draft model"),
    ([*GEN, "--remote", "http://127.0.0.1:9", "--draft", "ngram"], "--remote needs --draft"),
    # bench
    *[([*BENCH, "--prompts", v], "--prompts") for v in ["0", "x", "10001"]],
    *[([*BENCH, "--new-tokens", v], "--new-tokens") for v in ["0", "-1", "1048577"]],
    *[([*BENCH, "--temperature", v], "--temperature") for v in ["inf", "1e-300"]],
    *[([*BENCH, "--seed", v], "--seed") for v in ["-1", str(2**63)]],
    ([*BENCH, "--dram-budget", "x"], "--dram-budget"),
    ([*BENCH, "--read-limit", "1"], "--read-limit"),
    ([*BENCH, "--prefetch-depth", "0"], "--prefetch-depth"),
    ([*BENCH, "--read-queue-depth", "0"], "--read-queue-depth"),
    *[([*BENCH, "--modes", v], "bad mode spec")
      for v in ["tree:100000", "chain:65", "tree:16:65:8", "tree:16:4:65", "lever:1025", "lever:0", "tree:" + BIG]],
    ([*BENCH, "--modes", "ar", "lever", "--draft", "ngram"], "needs a draft model"),
    ([*BENCH, "--out", "{file}"], "--out"),
    *[([*BENCH, "--name", v], "--name") for v in ["a/b", "", ".."]],
    ([*BENCH, "--target-store", "{missing}"], "no such store directory", "lever convert"),
    ([*BENCH, "--target-store", "{file}"], "not a directory"),
    ([*BENCH, "--target-store", "{dir}", "--target", "smollm2-135m"], "not allowed with"),
    ([*BENCH, "--cache-dir", "{file}"], "--cache-dir"),
    ([*BENCH, "--prompt-set", "v99"], "v99"),
    ([*BENCH, "--categories", "poetry"], "poetry"),
    # profile
    (["profile"], "--draft"),
    (["profile", "--draft", "ngram"], "nothing to measure"),
    *[([*PROFILE, "--max-n", v], "--max-n") for v in ["0", "1025", "x"]],
    ([*PROFILE, "--dram-budget", "0"], "--dram-budget"),
    ([*PROFILE, "--read-limit", "1"], "--read-limit"),
    ([*PROFILE, "--prefetch-depth", "17"], "--prefetch-depth"),
    ([*PROFILE, "--read-queue-depth", "257"], "--read-queue-depth"),
    ([*PROFILE, "--plot", "{missing_dir_file}"], "--plot", "does not exist"),
    ([*PROFILE, "--plot", "{dir}"], "--plot", "is a directory"),
    ([*PROFILE, "--cache-dir", "{file}"], "--cache-dir"),
    ([*PROFILE, "--target-store", "{missing}"], "no such store directory"),
    # convert
    (["convert", "smollm2-135m"], "--out"),
    ([*CONVERT, "--out", "{file}"], "--out"),
    ([*CONVERT, "--out", "{dir}"], "already exists"),
    ([*CONVERT, "--out", "{missing}", "--dtype", "q9"], "--dtype"),
    *[([*CONVERT, "--out", "{missing}", "--weight-layout", v],
       "argument --weight-layout: expected one of repacked, gguf") for v in ["r8", "", "GGUF"]],
    ([*CONVERT, "--out", "{missing}", "--cache-dir", "{file}"], "--cache-dir"),
    (["convert", "{dir}", "--out", "{missing}"], "checkpoint directory"),
    (["convert", "{file}", "--out", "{missing}"], "not a GGUF file"),
    (["convert", "no-such-model", "--out", "{missing}"], "unknown model"),
    # models
    (["models", "--assemble", "no-such-model"], "unknown model"),
    (["models", "--cache-dir", "{file}"], "--cache-dir"),
    (["models", "--bogus"], "--bogus"),
]


def _id(case) -> str:
    text = " ".join(a if len(a) <= 24 else a[:12] + "..." for a in case[0]) or "(nothing)"
    return text.encode("ascii", "backslashreplace").decode()


@pytest.mark.parametrize("case", BAD, ids=[_id(c) for c in BAD])
def test_bad_input_is_one_error_line(case, paths, capsys, monkeypatch):
    argv, *fragments = case
    monkeypatch.setenv("LEVER_CACHE_DIR", paths["dir"])       # nothing is written to the user's cache
    argv = [a.format(**paths) if "{" in a else a for a in argv]
    fragments = [f.format(**paths) for f in fragments]
    rc, _, err = run_cli(capsys, argv)
    assert_one_error_line(rc, err, *fragments)


def test_an_argument_error_names_the_subcommand_help(capsys):
    rc, _, err = run_cli(capsys, ["bench", "--prompts", "0"])
    assert_one_error_line(rc, err, "argument --prompts: expected an integer from 1 to", "`lever bench --help`")


@pytest.mark.parametrize("data,fragment", [
    (b"\xff\xfe prompt", "not UTF-8"), (b"", "the prompt is empty"), (b"\n\n", "the prompt is empty"),
])
def test_bad_stdin_in_process(data, fragment, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    rc, _, err = run_cli(capsys, ["generate", "--prompt", "-"])
    assert_one_error_line(rc, err, "stdin", fragment)


def lever_process(args: list, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lever.cli", *args], input=stdin, capture_output=True,
                          timeout=LIMIT_S)


def test_invalid_utf8_on_real_stdin():
    p = lever_process(["generate", "--prompt", "-"], stdin=b"caf\xe9\n")
    assert_one_error_line(p.returncode, p.stderr.decode(), "the prompt on stdin is not UTF-8 text", "offset 3")


def test_invalid_utf8_in_argv():
    p = lever_process(["generate", "--prompt", b"caf\xe9"])
    assert_one_error_line(p.returncode, p.stderr.decode(), "--prompt is not UTF-8 text")


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--help"])
    assert e.value.code == 0
    assert "--prompt-file" in capsys.readouterr().out


# -- good inputs run ------------------------------------------------------------------

def generate_json(capsys, argv: list[str]) -> dict:
    rc, out, err = run_cli(capsys, ["generate", *argv, "--json"])
    assert rc == 0, err
    assert "Traceback" not in err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.real
def test_prompt_file_equals_prompt(smollm2_path, tmp_path, capsys):
    text = "Écris « bonjour » ✓\nin Python."
    (tmp_path / "prompt.txt").write_text(text, encoding="utf-8")
    common = ["--model", str(smollm2_path), "--max-new-tokens", "2"]
    from_file = generate_json(capsys, [*common, "--prompt-file", str(tmp_path / "prompt.txt")])
    inline = generate_json(capsys, [*common, "--prompt", text])
    assert from_file["token_ids"] == inline["token_ids"] and from_file["prompt_tokens"] == inline["prompt_tokens"]


@pytest.mark.real
def test_utf8_stdin_runs(smollm2_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("héllo ✓".encode()), encoding="utf-8"))
    out = generate_json(capsys, ["--model", str(smollm2_path), "--prompt", "-", "--max-new-tokens", "1"])
    assert out["new_tokens"] == 1


@pytest.mark.real
@pytest.mark.parametrize("sampling", [
    ["--temperature", "0.001", "--top-p", "1e-6", "--top-k", "0", "--seed", str(2**63 - 1)],
    ["--temperature", "100", "--top-p", "1", "--top-k", "1", "--seed", "0"],
    ["--max-new-tokens", "0"],
    ["--draft", "ngram", "--mode", "tree", "--tree-budget", "1024", "--tree-topk", "64", "--tree-depth", "64"],
], ids=["lowest", "highest", "zero-tokens", "largest-tree"])
def test_boundary_values_run(smollm2_path, capsys, sampling):
    out = generate_json(capsys, ["--model", str(smollm2_path), "--prompt", "hi", "--max-new-tokens", "2", *sampling])
    assert out["new_tokens"] <= 2


@pytest.mark.real
def test_lowest_read_limit_finishes(smollm2_path, tmp_path, capsys):
    """At the floor (MIN_READ_RATE, which also paces loading the pinned layers) a run
    streaming a few layers of SmolLM2 ends in seconds."""
    from lever.store.convert import convert
    from lever.store.manifest import StoreManifest
    from lever.store.residency import plan_residency

    store = convert(str(smollm2_path), tmp_path / "store", progress=False)
    m = StoreManifest.load(store)
    budget = 2 * m.weights_bytes
    while not plan_residency(m, budget, kv_tokens=2048).streamed:
        budget -= 1 << 20                                   # the largest budget that streams something
    assert m.weights_bytes / MIN_READ_RATE < LIMIT_S / 3     # seconds to load, then stream a pass
    t0 = time.monotonic()
    out = generate_json(capsys, ["--target-store", str(store), "--dram-budget", str(budget), "--prompt", "hi",
                                 "--max-new-tokens", "1", "--read-limit", f"{MIN_READ_RATE:.0f}"])
    assert out["new_tokens"] == 1 and out["flash"]["bytes_read"] > 0
    assert time.monotonic() - t0 < LIMIT_S
