"""Bucket graphs and the on-disk cache of QNN context binaries.

`BucketGraphs` hands out one ONNX Runtime session per (rows, context)
bucket, made on first use.  For ``cpu-static`` a session is built from the
graph in memory.  For ``qnn`` it is loaded from a *context binary*: the
graph compiled by the QNN HTP backend for one SoC (`*_ctx.onnx` naming a
`*_qnn.bin`), which is what a phone loads; a missing one is compiled once
and cached.  `lever compile-npu` prepares every bucket ahead of time
(`compile`, bucket by bucket; `compile_all` for a whole grid).

Cache layout: ``$LEVER_CACHE_DIR/npu/<key>/r{rows}_c{context}_ctx.onnx``
(+ ``_qnn.bin``) with one ``meta.json`` per key.  The key hashes what a
context binary depends on -- the model's layer shape (weights are graph
inputs, so the weights themselves do not matter), the graph format, the
dtype, the SoC and HTP architecture and the onnxruntime / QNN versions --
so a binary is never used for another model or version: `load` checks
meta.json and says what differs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from pathlib import Path

from ..atomic_write import write_atomic
from ..errors import LeverError
from ..gguf.registry import default_cache_dir
from ..model_config import ModelConfig
from .graph import layer_graph
from .runtime import GRAPH_DTYPE, NpuError, QnnTarget, check_backend, create_session, versions

GRAPH_VERSION = 2          # bump when layer_graph's inputs or outputs change (its arithmetic: graph_digest)
META = "meta.json"


def layer_signature(cfg: ModelConfig) -> dict:
    """What a layer graph depends on in a model: its architecture, dimensions and
    the block features the graph computes (RoPE's frequencies and the layer
    kinds are inputs: the rotary tables and masks)."""
    return {"arch": cfg.arch, "hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size,
            "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "bias": cfg.attention_bias,
            "qk_norm": cfg.qk_norm, "sandwich_norms": cfg.sandwich_norms, "activation": cfg.activation,
            "rotary_dims": cfg.rotary_dims, "query_scale": cfg.query_scale}


@functools.lru_cache(maxsize=16)
def graph_digest(cfg: ModelConfig, dtype: str) -> str:
    """A hash of the layer graph Lever writes today (a 1-row, 1-context bucket):
    any change to lever.npu.graph's arithmetic makes older binaries stale."""
    return hashlib.sha256(layer_graph(cfg, 1, 1, dtype).SerializeToString()).hexdigest()[:16]


def context_meta(cfg: ModelConfig, target: QnnTarget) -> dict:
    """The meta.json a context directory for `cfg` on `target` must hold."""
    return {"graph_version": GRAPH_VERSION, "graph_digest": graph_digest(cfg, GRAPH_DTYPE["qnn"]),
            "model": layer_signature(cfg), "dtype": GRAPH_DTYPE["qnn"],
            "soc_model": target.soc_model, "htp_arch": target.htp_arch, "versions": versions()}


def context_dir(cfg: ModelConfig, target: QnnTarget, root: str | os.PathLike | None = None) -> Path:
    """The cache directory of `cfg`'s context binaries for `target` (see the module docstring)."""
    meta = context_meta(cfg, target)
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    base = Path(root) if root is not None else default_cache_dir() / "npu"
    return base / f"{cfg.arch}-h{cfg.hidden_size}-soc{target.soc_model}-{key}"


def bucket_stem(rows: int, context: int) -> str:
    return f"r{rows}_c{context}"


def check_meta(directory: Path, want: dict) -> None:
    """NpuError (one line) unless `directory`'s meta.json equals `want`."""
    path = directory / META
    try:
        have = json.loads(path.read_text())
    except FileNotFoundError:
        raise NpuError(f"{directory} holds no {META}: it is not a Lever context directory") from None
    except (OSError, ValueError) as e:
        raise NpuError(f"{path} is unreadable ({e}); delete it and run lever compile-npu again") from None
    for field in ("graph_version", "graph_digest", "model", "dtype", "soc_model", "htp_arch", "versions"):
        if have.get(field) != want[field]:
            raise NpuError(f"the context binaries in {directory} were built for {field} {have.get(field)!r}, "
                           f"this run needs {want[field]!r}: run lever compile-npu again")


class BucketGraphs:
    """One session per (rows, context) bucket of `cfg`'s layer graph on `backend`.

    threads: onnxruntime's intra-op threads per session.  target: the SoC
    (qnn only).  root: the context cache's parent directory (default
    ``$LEVER_CACHE_DIR/npu``).  compile_s and compiled count the context
    binaries this object compiled (seconds, buckets)."""

    def __init__(self, cfg: ModelConfig, backend: str, threads: int = 1, target: QnnTarget | None = None,
                 root: str | os.PathLike | None = None):
        self.cfg, self.backend = cfg, check_backend(backend)
        self.dtype = GRAPH_DTYPE[backend]
        self.threads = threads
        self.target = (target or QnnTarget()) if backend == "qnn" else None
        self.directory = context_dir(cfg, self.target, root) if backend == "qnn" else None
        self._sessions: dict[tuple[int, int], object] = {}
        self.compile_s, self.compiled = 0.0, 0

    def session(self, rows: int, context: int):
        """The session of bucket (rows, context), made (and for qnn compiled) on first use."""
        key = (int(rows), int(context))
        if key not in self._sessions:
            if self.backend == "cpu-static":
                model = layer_graph(self.cfg, *key, self.dtype).SerializeToString()
                self._sessions[key] = create_session(model, "cpu-static", self.threads)
            else:
                self._sessions[key] = self.load(*key)
        return self._sessions[key]

    def context_path(self, rows: int, context: int) -> Path:
        return self.directory / f"{bucket_stem(rows, context)}_ctx.onnx"

    def load(self, rows: int, context: int):
        """The qnn session of a bucket from its context binary (compiled if absent)."""
        path = self.context_path(rows, context)
        if not path.exists():
            self.compile(rows, context)
        check_meta(self.directory, context_meta(self.cfg, self.target))
        return create_session(path, "qnn", self.threads, self.target)

    def compile(self, rows: int, context: int) -> Path:
        """Compile bucket (rows, context) into a context binary; returns its *_ctx.onnx."""
        if self.backend != "qnn":
            raise LeverError("context binaries are for the qnn backend")
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = self.directory / META
        if not meta.exists():
            write_atomic(meta, json.dumps(context_meta(self.cfg, self.target), indent=1, sort_keys=True))
        check_meta(self.directory, context_meta(self.cfg, self.target))
        stem = bucket_stem(rows, context)
        graph_path = self.directory / f"{stem}.onnx"
        out = self.context_path(rows, context)
        for stale in (out, self.directory / f"{stem}_ctx_qnn.bin"):
            stale.unlink(missing_ok=True)
        t0 = time.perf_counter()
        write_atomic(graph_path, layer_graph(self.cfg, rows, context, self.dtype).SerializeToString())
        create_session(graph_path, "qnn", self.threads, self.target,
                       config={"ep.context_enable": "1", "ep.context_file_path": str(out),
                               "ep.context_embed_mode": "0"})
        graph_path.unlink(missing_ok=True)
        if not out.exists():
            raise NpuError(f"onnxruntime-qnn wrote no context binary for bucket {stem} in {self.directory}")
        self.compile_s += time.perf_counter() - t0
        self.compiled += 1
        return out

    def compile_all(self, rows, contexts, progress=None) -> list[Path]:
        """Compile every (rows, context) bucket; progress(done, total, stem) after each."""
        pairs = [(r, c) for r in rows for c in contexts]
        out = []
        for k, (r, c) in enumerate(pairs):
            out.append(self.compile(r, c))
            if progress is not None:
                progress(k + 1, len(pairs), bucket_stem(r, c))
        return out
