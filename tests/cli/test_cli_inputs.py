"""Every command-line input either runs or ends with exactly one `lever: error:`
line on stderr and exit status 2 -- no traceback, no hang. A matrix of bad
values for every option of generate, bench, profile, convert and models runs
through `lever.cli.main` in-process (each bounded by a timer); invalid UTF-8
on stdin and in argv go through a real process; a few good inputs, boundary
values included, run to the end."""

import io
import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest

from lever.cli import main
from lever.commands.limits import MAX_CONTEXT_TOKENS, MAX_PROMPT_BYTES, MAX_TREE_NODES, MIN_READ_RATE
from lever.commands.serve_verifier import MAX_TOKEN_FILE_BYTES
from waiting import deadline

LIMIT_S = 60                   # a safety net per case (waiting.deadline scales it): a hang fails, not blocks
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
    with time_limit(deadline(limit)):
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
    os.mkfifo(tmp_path / "fifo")                                 # nothing ever writes to it
    (tmp_path / "token").write_text("a-token-of-some-length-0123456789\n")
    (tmp_path / "token").chmod(0o600)
    (tmp_path / "big-token").write_bytes(b"t" * (MAX_TOKEN_FILE_BYTES + 1))
    (tmp_path / "big-token").chmod(0o600)
    return {"dir": str(tmp_path / "dir"), "file": str(tmp_path / "file.txt"),
            "latin1": str(tmp_path / "latin1.txt"), "empty": str(tmp_path / "empty.txt"),
            "blank": str(tmp_path / "blank.txt"), "huge": str(tmp_path / "huge.txt"),
            "missing": str(tmp_path / "missing"), "missing_dir_file": str(tmp_path / "missing" / "x.png"),
            "fifo": str(tmp_path / "fifo"), "token": str(tmp_path / "token"),
            "big_token": str(tmp_path / "big-token")}


GEN = ["generate", "--prompt", "hi"]
BENCH = ["bench", "--quick"]
PROFILE = ["profile", "--draft", "smollm2-135m"]
CONVERT = ["convert", "smollm2-135m"]
REMOTE = [*GEN, "--remote", "http://127.0.0.1:9", "--draft", "smollm2-135m"]
SERVE_V = ["serve-verifier", "--model", "smollm2-135m"]
NON_FINITE = ["inf", "-inf", "nan", "NaN", "Infinity", "1e999"]

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
    # files that are not regular files: refused before any read, never a hang or an endless read
    (["generate", "--prompt-file", "{fifo}"], "--prompt-file {fifo}: is a FIFO, not a regular file", "--prompt -"),
    (["generate", "--prompt-file", "/dev/zero"], "--prompt-file /dev/zero: is a character device, not a regular file"),
    ([*REMOTE, "--token-file", "/dev/zero"], "--token-file /dev/zero: is a character device, not a regular file"),
    ([*REMOTE, "--token-file", "{fifo}"], "--token-file {fifo}: is a FIFO, not a regular file"),
    ([*REMOTE, "--token-file", "{dir}"], "--token-file {dir}: is a directory, not a regular file"),
    ([*REMOTE, "--token-file", "{big_token}"], "--token-file {big_token}: larger than 4,096 bytes"),
    (["serve", "--token-file", "/dev/zero"], "--token-file /dev/zero: is a character device, not a regular file"),
    (["serve", "--token-file", "{fifo}"], "--token-file {fifo}: is a FIFO, not a regular file"),
    ([*SERVE_V, "--token-file", "/dev/zero"], "--token-file /dev/zero: is a character device, not a regular file"),
    ([*SERVE_V, "--token-file", "{fifo}"], "--token-file {fifo}: is a FIFO, not a regular file"),
    ([*SERVE_V, "--token-file", "{token}", "--tls-cert", "{fifo}", "--tls-key", "{file}"],
     "--tls-cert {fifo}: is a FIFO, not a regular file"),
    ([*SERVE_V, "--token-file", "{token}", "--tls-cert", "{file}", "--tls-key", "/dev/zero"],
     "--tls-key /dev/zero: is a character device, not a regular file"),
    # server URLs
    *[([*GEN, "--remote", v], "argument --remote: expected http://HOST:PORT or https://HOST:PORT", extra)
      for v, extra in [("http://127.0.0.1:99999", "a number from 1 to 65535"), ("http://127.0.0.1:0", "1 to 65535"),
                       ("http://h:port", "1 to 65535"), ("ftp://127.0.0.1:21", "ftp://"), ("http://:80", "://:80"),
                       ("127.0.0.1:8000", "127.0.0.1:8000"), ("http://[::1", "[::1")]],
    ([*GEN, "--remote", "http://user:secret@127.0.0.1:8000"], "argument --remote", "--token-file"),
    # static-shape buckets: bounded before anything is compiled or allocated
    ([*GEN, "--contexts", "99999999999999"], "argument --contexts: context buckets must be at most",
     f"{MAX_CONTEXT_TOKENS:,} tokens"),
    ([*GEN, "--buckets", "1,8,100000"], "argument --buckets: row buckets must be at most", f"{MAX_TREE_NODES:,}"),
    (["compile-npu", "--buckets", "99999999999"], "argument --buckets: row buckets must be at most"),
    (["compile-npu", "--contexts", "128,99999999"], "argument --contexts: context buckets must be at most"),
    (["bench", "--contexts", str(MAX_CONTEXT_TOKENS + 1)], "argument --contexts"),
    # no option takes an infinite or NaN number
    *[(["serve-verifier", f"--batch-window-ms={v}"], "argument --batch-window-ms: expected a number from 0 to 10000")
      for v in NON_FINITE],
    *[([*GEN, f"--timeout={v}"], "argument --timeout: expected a number") for v in NON_FINITE],
    *[(["serve", f"--header-timeout={v}"], "argument --header-timeout") for v in NON_FINITE],
    *[(["serve-verifier", f"--idle-ttl={v}"], "argument --idle-ttl") for v in NON_FINITE],
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
                          timeout=deadline(LIMIT_S))


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
    streaming a few layers of SmolLM2 ends: what it reads takes seconds at that rate
    (the run itself is bounded only by run_cli's safety net)."""
    from lever.store.convert import convert
    from lever.store.manifest import StoreManifest
    from lever.store.residency import plan_residency

    store = convert(str(smollm2_path), tmp_path / "store", progress=False)
    m = StoreManifest.load(store)
    budget = 2 * m.weights_bytes
    while not plan_residency(m, budget, kv_tokens=2048).streamed:
        budget -= 1 << 20                                   # the largest budget that streams something
    assert m.weights_bytes / MIN_READ_RATE < LIMIT_S / 3     # seconds to load, then stream a pass
    out = generate_json(capsys, ["--target-store", str(store), "--dram-budget", str(budget), "--prompt", "hi",
                                 "--max-new-tokens", "1", "--read-limit", f"{MIN_READ_RATE:.0f}"])
    assert out["new_tokens"] == 1 and out["flash"]["bytes_read"] > 0
