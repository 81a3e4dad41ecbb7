"""Edge-cloud mode with a real `lever serve-verifier` process: killed and
restarted mid-generation (same output), unreachable (a clear error, the
tokens kept), the command line on both sides (auth, refusals)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from lever.api import load
from lever.cli import main
from lever.draft.base import TreeShape
from lever.remote.client import RemoteVerifier, VerifierUnreachableError
from lever.edge import RemoteTarget
from waiting import deadline, wait_until

pytestmark = pytest.mark.real

PROMPT = "Write a Python function that checks whether a string is a palindrome."
TOKEN = "edge-token-42-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`lever serve-verifier` on smollm2-135m, started and killed by the test."""

    def __init__(self, model_path, cache_dir, port: int, extra=()):
        self.cmd = [sys.executable, "-m", "lever.cli", "serve-verifier", "--model", str(model_path),
                    "--port", str(port), "--cache-dir", str(cache_dir), "--max-tree-nodes", "64", *extra]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None
        self.log: list[str] = []

    def start(self) -> "ServerProcess":
        """Start it and wait for its "serving" line (or its exit; a safety net of deadline(120) s)."""
        self.proc = subprocess.Popen(self.cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        serving = threading.Event()
        threading.Thread(target=self._drain, args=(self.proc, serving), daemon=True).start()
        try:
            wait_until(lambda: serving.is_set() or self.proc.poll() is not None, 120, "the server to start")
        except AssertionError:
            pass
        if not serving.is_set():
            self.kill()
            raise AssertionError("the server did not start:\n" + "".join(self.log))
        return self

    def _drain(self, proc: subprocess.Popen, serving: threading.Event) -> None:
        for line in proc.stderr:
            self.log.append(line)
            if "serving" in line:
                serving.set()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def draft(smollm2_path, lever_cache):
    """SmolLM2 drafting for itself, native with a float32 KV cache (the server's is
    bfloat16): its drafts sometimes differ from the target."""
    return load(str(smollm2_path), dtype="float32", cache_dir=lever_cache, progress=False)


@pytest.fixture(scope="module")
def reference(smollm2_path, lever_cache):
    target = load(str(smollm2_path), cache_dir=lever_cache, progress=False)
    return target.generate(PROMPT, max_new_tokens=40).token_ids


@pytest.fixture(scope="module")
def sampled_reference(smollm2_path, lever_cache):
    """Plain sampling in this process: tokens for sampling keyword arguments."""
    target = load(str(smollm2_path), cache_dir=lever_cache, progress=False)
    return lambda **sampled: target.generate(PROMPT, max_new_tokens=40, **sampled).token_ids


@pytest.fixture()
def server(smollm2_path, lever_cache):
    s = ServerProcess(smollm2_path, lever_cache, free_port())
    s.start()
    yield s
    s.kill()


def generate_with_restart(server, remote, restart_after: int, **kw):
    """Generate; after `restart_after` tokens kill the server and start it again
    (on the same port) half a second later, while the client keeps going."""
    seen, restarter = [], []

    def on_text(_):
        seen.append(1)
        if len(seen) == restart_after:
            server.kill()
            t = threading.Thread(target=lambda: (time.sleep(0.5), server.start()))
            t.start()
            restarter.append(t)

    out = remote.generate(PROMPT, max_new_tokens=40, on_text=on_text, **kw)
    for t in restarter:
        t.join()
    return out


def test_server_killed_and_restarted_mid_generation(server, draft, reference, sampled_reference, tmp_path):
    remote = RemoteTarget(server.url, draft=draft, mode="tree", tree=TreeShape(8, 2, 4), retry_deadline_s=deadline(120),
                          cache_dir=tmp_path, progress=False)
    out = generate_with_restart(server, remote, restart_after=10)
    assert out.token_ids == reference
    assert out.remote["rebuilds"] >= 1 and out.remote["retries"] >= 1 and out.remote["sessions"] >= 2
    # sampling is keyed by position, so a restart changes nothing either, and the
    # text is plain sampling's in this process with the same seed
    sampled = dict(temperature=0.9, top_p=0.95, seed=11)
    calm = remote.generate(PROMPT, max_new_tokens=40, **sampled)
    stormy = generate_with_restart(server, remote, restart_after=12, **sampled)
    assert stormy.token_ids == calm.token_ids and stormy.remote["rebuilds"] >= 1
    assert calm.token_ids == sampled_reference(**sampled)
    assert calm.token_ids != reference             # it did sample


def test_unreachable_server_stops_with_the_tokens_kept(server, draft, reference, tmp_path):
    remote = RemoteTarget(server.url, draft=draft, mode="tree", tree=TreeShape(8, 2, 4), retry_deadline_s=1.5,
                          cache_dir=tmp_path, progress=False)
    count = []

    def on_text(_):
        count.append(1)
        if len(count) == 10:
            server.kill()

    with pytest.raises(VerifierUnreachableError, match="did not answer") as info:
        remote.generate(PROMPT, max_new_tokens=40, on_text=on_text)
    kept = info.value.partial_result.token_ids
    assert 10 <= len(kept) < 40 and kept == reference[:len(kept)]     # the target's tokens, no draft-only text
    assert info.value.remote["retries"] >= 1


def test_cli_client_and_server_with_a_token(smollm2_path, lever_cache, reference, tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    s = ServerProcess(smollm2_path, lever_cache, free_port(), extra=["--token-file", str(token_file)]).start()
    try:
        common = ["generate", "--remote", s.url, "--draft", str(smollm2_path), "--prompt", PROMPT,
                  "--max-new-tokens", "40", "--cache-dir", str(tmp_path), "--json"]
        assert main([*common, "--token-file", str(token_file)]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["token_ids"] == reference and out["mode"] == "lever"
        assert out["remote"]["target_calls"] == out["speculative"]["iterations"] > 0
        assert main([*common, "--token-file", str(token_file), "--mode", "ar"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["token_ids"] == reference and out["remote"]["target_calls_per_token"] == 1.0
        assert main(common) == 2
        assert "401" in capsys.readouterr().err
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token")
        assert main([*common, "--token-file", str(wrong)]) == 2
        assert "403" in capsys.readouterr().err
    finally:
        s.kill()


def test_cli_keeps_the_tokens_when_the_server_goes_away(server, smollm2_path, reference, tmp_path, capsys,
                                                        monkeypatch):
    original, calls = RemoteVerifier.verify, []

    def verify(self, tree, draft_probs=None):
        calls.append(1)
        if len(calls) == 4:
            server.kill()
        return original(self, tree, draft_probs)

    monkeypatch.setattr(RemoteVerifier, "verify", verify)
    argv = ["generate", "--remote", server.url, "--draft", str(smollm2_path), "--mode", "ar", "--prompt", PROMPT,
            "--max-new-tokens", "40", "--retry-deadline", "1", "--cache-dir", str(tmp_path)]
    assert main([*argv, "--json"]) == 2
    captured = capsys.readouterr()
    out = json.loads(captured.out.strip().splitlines()[-1])
    assert out["token_ids"] == reference[:3] and "did not answer" in out["error"] and out["new_tokens"] == 3
    assert "the 3 tokens generated before the failure are kept" in captured.err


def test_cli_unreachable_is_one_clear_error(smollm2_path, tmp_path, capsys):
    port = free_port()          # nothing listens there
    assert main(["generate", "--remote", f"http://127.0.0.1:{port}", "--draft", str(smollm2_path), "--prompt", "hi",
                 "--retry-deadline", "0.5", "--cache-dir", str(tmp_path)]) == 2
    assert "did not answer" in capsys.readouterr().err


def test_cli_refusals(smollm2_path, tmp_path, capsys):
    def refused(argv, needle):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err, err

    serve = ["serve-verifier", "--model", str(smollm2_path), "--port", "0"]
    refused([*serve, "--host", "0.0.0.0"], "without authentication")
    refused([*serve, "--token-file", str(tmp_path / "missing")], "cannot be read")
    (tmp_path / "empty").write_text("  \n")
    refused([*serve, "--token-file", str(tmp_path / "empty")], "expected one token")
    refused([*serve, "--max-sessions", "0"], "argument --max-sessions: expected an integer from 1 to 4,096")
    refused([*serve, "--header-timeout", "0"], "argument --header-timeout: expected a number from 0.01 to 3600")
    refused([*serve, "--prefill-chunk", "0"], "argument --prefill-chunk: expected an integer from 1 to")
    (tmp_path / "short").write_text("abc")
    (tmp_path / "short").chmod(0o600)
    refused([*serve, "--token-file", str(tmp_path / "short")], "at least 16")
    (tmp_path / "open").write_text("x" * 32)
    (tmp_path / "open").chmod(0o644)
    refused([*serve, "--token-file", str(tmp_path / "open")], "chmod 600")
    gen = ["generate", "--remote", "http://127.0.0.1:1", "--prompt", "x"]
    refused(gen, "--remote needs --draft")
    refused([*gen, "--draft", "ngram"], "--remote needs --draft")
    refused([*gen, "--draft", str(smollm2_path), "--target-store", str(tmp_path)], "choose one")
    refused(["generate", "--remote", "ftp://x", "--draft", str(smollm2_path), "--prompt", "x",
             "--cache-dir", str(tmp_path)], "expected http://HOST:PORT")
