"""A cache that cannot cost an answer (issue 42, part 1): with the cache full
(ENOSPC), read-only (EROFS) or forbidden (EACCES), `lever generate --json`
in mode lever still prints its JSON and exits 0, with one warning line per
file it could not save, naming it; no temporary file survives.  Outputs the
user asked for (a store, traces, a probe) still fail, in one line naming
the file.  A `kill -9` of `lever convert` leaves its temporary directory,
which the next conversion into that directory sweeps.

ENOSPC and EROFS come from a real tmpfs (mounted as root: a small one filled
up, or one remounted read-only); where mounting is not allowed, the same
error is injected into the write.  EACCES is always injected (root ignores
permissions)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lever import atomic_write
from lever.atomic_write import SaveError, save_cache_file, sweep_stale, write_atomic
from lever.cli import main
from waiting import deadline, wait_until

PROMPT = "The capital of France is"


def generate_json(capsys, cache: Path) -> tuple[int, dict | None, list[str]]:
    """`lever generate --json` in mode lever with `cache`: (rc, the JSON or None, stderr lines
    that are warnings or errors)."""
    rc = main(["generate", "--model", "smollm2-135m", "--draft", "smollm2-135m", "--mode", "lever", "-n", "12",
               "--json", "--prompt", PROMPT, "--cache-dir", str(cache)])
    c = capsys.readouterr()
    answer = json.loads(c.out) if c.out.strip() else None
    return rc, answer, [x for x in c.err.splitlines() if x.startswith("lever: ")]


def temp_leftovers(root: Path) -> list[Path]:
    """Temporary files or directories anywhere under `root`."""
    return [p for p in root.rglob(".*") if ".tmp" in p.name or ".old" in p.name]


@pytest.fixture(scope="module")
def primed(smollm2_path, tmp_path_factory) -> Path:
    """A cache after one mode-lever run: verification record, tokenizer, quick
    profile and calibration all saved."""
    cache = tmp_path_factory.mktemp("primed") / "cache"
    assert main(["generate", "--model", "smollm2-135m", "--draft", "smollm2-135m", "--mode", "lever", "-n", "4",
                 "--prompt", PROMPT, "--cache-dir", str(cache)]) == 0
    assert sorted(p.name for p in cache.iterdir()) == ["models", "profiles", "tokenizers"]
    return cache


@contextlib.contextmanager
def tmpfs(directory: Path, size: str):
    """A tmpfs of `size` mounted at `directory` (made), or None when not root
    (a failed mount as root fails the test); unmounted afterwards."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:            # only root mounts: the tests inject the errors instead
        yield None
        return
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"root could not mount a tmpfs: {out.stderr.strip()}"
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def fill(directory: Path) -> None:
    """Write into `directory` until its file system is full."""
    with open(directory / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC


def remount_read_only(directory: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True, capture_output=True)


def inject(monkeypatch, code: int) -> None:
    """Every temporary file lever.atomic_write opens fails with `code` once
    written (its fsync), as a full or read-only disk would."""
    real_fsync = os.fsync

    def failing_fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith("."):
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)


def assert_one_warning_per_file(lines: list[str], reason: str, *names: str) -> None:
    assert not [x for x in lines if x.startswith("lever: error")], lines
    assert len(lines) == len(names), lines
    for line, name in zip(lines, names):
        assert line.startswith("lever: warning: cannot save ") and f"({reason})" in line, line
        assert name in line, (name, line)


# -- generate with a full, read-only or forbidden cache ---------------------------------

@pytest.mark.parametrize("size, fault, code, reason", [
    ("4m", fill, errno.ENOSPC, "No space left on device"),
    ("8m", remount_read_only, errno.EROFS, "Read-only file system"),
], ids=["full", "read-only"])
def test_a_full_or_read_only_cache_still_answers(capsys, primed, tmp_path, monkeypatch, size, fault, code, reason):
    with tmpfs(tmp_path / "mnt", size) as mnt:
        cache = (mnt or tmp_path) / "cache"
        shutil.copytree(primed, cache)
        if mnt is not None:
            fault(mnt)
        else:
            inject(monkeypatch, code)
        rc, answer, lines = generate_json(capsys, cache)
        assert rc == 0 and answer["new_tokens"] == 12 and answer["text"]
        assert_one_warning_per_file(lines, reason, "/profiles/calibration-")
        assert temp_leftovers(cache) == []


def test_empty_read_only_cache_warns_once_per_file(capsys, tmp_path, monkeypatch, smollm2_path):
    """Nothing can be cached: the verification record, the tokenizer, the
    profile and the calibration each cost one warning line; the answer stands."""
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        if mnt is None:
            pytest.skip("a read-only mount needs root")
        remount_read_only(mnt)
        rc, answer, lines = generate_json(capsys, mnt / "cache")
        assert rc == 0 and answer["new_tokens"] == 12
        assert_one_warning_per_file(lines, "Read-only file system", "smollm2-135m.gguf.verified",
                                    "/tokenizers/", "/profiles/", "/profiles/calibration-")


def test_forbidden_cache_still_answers(capsys, primed, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    shutil.copytree(primed, cache)
    real_open = open

    def forbidden(path, *args, **kwargs):
        if str(path).startswith(str(cache)) and "w" in (args[0] if args else kwargs.get("mode", "r")):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(atomic_write, "open", forbidden, raising=False)
    rc, answer, lines = generate_json(capsys, cache)
    assert rc == 0 and answer["new_tokens"] == 12
    assert_one_warning_per_file(lines, "Permission denied", "/profiles/calibration-")
    assert temp_leftovers(cache) == []


# -- the helper itself ------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["enospc", "erofs", "eacces"])
def test_write_atomic_names_the_file_and_leaves_no_temp(tmp_path, monkeypatch, fault):
    code = {"enospc": errno.ENOSPC, "erofs": errno.EROFS, "eacces": errno.EACCES}[fault]
    target = tmp_path / "d" / "x.json"
    target.parent.mkdir()
    target.write_text("old")
    inject(monkeypatch, code)
    with pytest.raises(SaveError) as e:
        write_atomic(target, "new")
    assert str(e.value) == f"cannot save {target} ({os.strerror(code)})"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.json"] and target.read_text() == "old"


def test_write_atomic_on_a_full_tmpfs(tmp_path):
    with tmpfs(tmp_path / "mnt", "64k") as mnt:
        if mnt is None:
            pytest.skip("mounting a tmpfs needs root")
        with pytest.raises(SaveError, match=r"\(No space left on device\)$") as e:
            write_atomic(mnt / "big.bin", b"x" * (1 << 20))
        assert e.value.path == mnt / "big.bin" and e.value.errno == errno.ENOSPC
        assert list(mnt.iterdir()) == []


def test_cache_file_warns_once_per_file(tmp_path, monkeypatch, capsys):
    inject(monkeypatch, errno.ENOSPC)
    target = tmp_path / "c.json"
    assert not save_cache_file(target, "{}", "it is measured again")
    assert not save_cache_file(target, "{}", "it is measured again")
    err = capsys.readouterr().err
    assert err == f"lever: warning: cannot save {target} (No space left on device); it is measured again\n"


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_takes_dead_writers_files_only(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        gone = dead_pid()
        stale = [tmp_path / f".a.json.{gone}.tmp", tmp_path / f".b.json.{gone}-3.tmp",
                 tmp_path / f".t.{gone}.tmp.npz", tmp_path / f".ours.{os.getpid()}-999.tmp"]
        kept = [tmp_path / f".a.json.{live.pid}-0.tmp", tmp_path / "a.json", tmp_path / ".hidden",
                tmp_path / f"x.{gone}.tmp"]                          # not hidden: not one of ours
        for p in stale + kept:
            p.write_text("x")
        (tmp_path / f".st.tmp-{gone}").mkdir()
        (tmp_path / f".st.tmp-{gone}" / "weights.bin").write_text("x")
        removed = sweep_stale(tmp_path)
        assert sorted(removed) == sorted(stale + [tmp_path / f".st.tmp-{gone}"])
        assert all(p.exists() for p in kept)
    finally:
        live.communicate(b"")


def test_sweep_spares_what_this_process_is_writing(tmp_path):
    with atomic_write.atomic_temp(tmp_path / "f.json") as tmp:
        tmp.write_text("partial")
        assert sweep_stale(tmp_path) == [] and tmp.exists()
    assert (tmp_path / "f.json").read_text() == "partial"


# -- outputs the user asked for fail, naming the file ----------------------------------

def test_convert_into_a_full_disk_names_the_file(capsys, smollm2_path, tmp_path, monkeypatch):
    with tmpfs(tmp_path / "mnt", "8m") as mnt:
        out = (mnt or tmp_path / "plain") / "store"
        if mnt is None:
            inject(monkeypatch, errno.ENOSPC)
        rc = main(["convert", str(smollm2_path), "--out", str(out)])
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("lever: ")]   # not the bar
        assert rc == 2 and len(err) == 1, err
        assert err[0].startswith(f"lever: error: cannot write the store {out} (")
        assert "No space left on device)" in err[0]
        assert list(out.parent.iterdir()) == []


def test_trace_output_that_cannot_be_written_is_an_error(tmp_path, monkeypatch):
    from lever.probe import traces
    inject(monkeypatch, errno.ENOSPC)
    with pytest.raises(SaveError, match=r"meta.json \(No space left on device\)"):
        traces._write_json(tmp_path / "meta.json", {"a": 1})
    with pytest.raises(SaveError, match=r"prompt-000.npz \(No space left on device\)"):
        traces._write_npz(tmp_path / "prompt-000.npz", {"a": [1, 2]})
    assert list(tmp_path.iterdir()) == []


def test_tokenizer_cache_that_cannot_be_written_warns(tmp_path, capsys, monkeypatch):
    from lever.model.tokenizer_cache import TokenizerCache

    class Model:
        def save(self, directory):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    class Tok:
        model = Model()

    TokenizerCache(tmp_path / "tok").store("k1", Tok(), None, None, [])
    err = capsys.readouterr().err
    assert err == (f"lever: warning: cannot save {tmp_path / 'tok' / 'k1'} (No space left on device); "
                   f"the tokenizer is built again on the next load\n")
    assert list((tmp_path / "tok").iterdir()) == []


# -- kill -9 of a conversion, then a sweep --------------------------------------------

def test_killed_convert_leaves_a_temp_dir_the_next_one_sweeps(smollm2_path, tmp_path, capsys):
    out = tmp_path / "st"
    child = subprocess.Popen([sys.executable, "-c", "import sys; from lever.cli import main; sys.exit(main())",
                              "convert", str(smollm2_path), "--out", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    temp = tmp_path / f".st.tmp-{child.pid}"
    def writing() -> bool:
        assert child.poll() is None, f"the conversion exited ({child.returncode}) before it was killed"
        return (temp / "weights.bin").is_file() and (temp / "weights.bin").stat().st_size > 0

    try:
        wait_until(writing, deadline(120), "the conversion to start writing")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=deadline(30))
    assert temp.is_dir() and not out.exists()                 # what kill -9 leaves
    assert main(["convert", str(smollm2_path), "--out", str(tmp_path / "st2")]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st2"]
