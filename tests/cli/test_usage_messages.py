"""The command-line reproducers of issue 42 (part 5): each ends in the real
message on one `lever: error:` line (exit status 2), or is accepted."""

from __future__ import annotations

import pytest

from lever.cli import main
from lever.http.address import base_url, loopback_address


def one_error(capsys, *argv: str) -> str:
    """The one `lever: error:` line of `lever ARGV` (exit status 2)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lever: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv", [["--version", "extra"], ["--version", "generate"], ["--version", "--help"]])
def test_version_takes_no_other_argument(capsys, argv):
    """The reproducer: `lever --version extra` printed the version and exited 0."""
    line = one_error(capsys, *argv)
    assert "--version takes no other arguments" in line and repr(" ".join(argv[1:])) in line, line


@pytest.mark.parametrize("command", ["generate", "serve", "serve-verifier", "bench", "profile"])
@pytest.mark.parametrize("option", ["--memory-limit", "--dram-budget"])
def test_a_negative_size_says_it_must_be_positive(capsys, command, option):
    """The reproducer: `--memory-limit -1GB` said "expected one argument" (argparse took -1GB for an option)."""
    line = one_error(capsys, command, "--model", "smollm2-135m", option, "-1GB")
    assert f"argument {option}: a size must be positive" in line and "'-1GB'" in line, line
    assert "expected one argument" not in line


@pytest.mark.parametrize("value", ["-inf", "-.5", "-1e3"])
def test_other_negative_values_reach_their_option(capsys, value):
    line = one_error(capsys, "generate", "--temperature", value)
    assert "argument --temperature: temperature must be" in line, line


@pytest.mark.parametrize("sub", ["train", "report"])
def test_traces_that_name_a_file_say_so(capsys, tmp_path, sub):
    """The reproducer: `probe train --traces FILE` said "no such trace directory"."""
    trace = tmp_path / "traces.json"
    trace.write_text("{}")
    line = one_error(capsys, "probe", sub, "--traces", str(trace))
    assert f"{trace}: is a file, not a trace directory" in line, line
    line = one_error(capsys, "probe", sub, "--traces", str(tmp_path / "missing"))
    assert "no such trace directory" in line, line


@pytest.mark.parametrize("address, loopback", [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True),
                                               ("::ffff:127.0.0.1", True), ("::ffff:127.9.9.9", True),
                                               ("::ffff:10.0.0.1", False), ("10.0.0.1", False),
                                               ("::", False), ("fe80::1%lo", False)])
def test_loopback_addresses(address, loopback):
    assert loopback_address(address) is loopback


@pytest.mark.parametrize("command", ["serve", "serve-verifier"])
def test_an_ipv4_mapped_loopback_host_needs_no_token(capsys, tmp_path, command):
    """The reproducer: `--host ::ffff:127.0.0.1` was refused as non-loopback.  It passes that check
    now and fails later, at the (missing) model; a routable address is still refused."""
    model = str(tmp_path / "missing.gguf")
    line = one_error(capsys, command, "--model", model, "--host", "::ffff:127.0.0.1")
    assert "without authentication" not in line and "missing.gguf" in line, line
    line = one_error(capsys, command, "--model", model, "--host", "10.1.2.3")
    assert "refusing to serve on 10.1.2.3 without authentication" in line, line


def test_urls_bracket_ipv6_hosts():
    assert base_url("http", "::1", 8000) == "http://[::1]:8000"
    assert base_url("https", "::ffff:127.0.0.1", 1) == "https://[::ffff:127.0.0.1]:1"
    assert base_url("http", "127.0.0.1", 80) == "http://127.0.0.1:80"
    assert base_url("http", "localhost", 80) == "http://localhost:80"
    pytest.importorskip("aiohttp")
    from lever.http.common import SiteThread
    assert SiteThread(None, host="::1", port=5).url == "http://[::1]:5"
