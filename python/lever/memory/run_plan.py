"""`--memory-limit SIZE` for one run: what the target may hold, before anything loads.

A command that takes `--memory-limit` calls `plan_run` first thing: it
measures the runtime's baseline RSS (interpreter, numpy, the native module,
the tokenizer already loaded), sizes the draft from its GGUF header (weights
and KV cache, never loading it), adds the scratch a pass needs (activations,
and the logits rows sampling keeps), and hands the target what is left:

- a flash-store target gets that as its DRAM budget (`store_budget_bytes`,
  passed to `store.residency.plan_residency`: pinned layers, read ring, KV);
- an in-memory target must fit whole (weights + KV), or the run is refused.

A limit below the minimum raises MemoryLimitError listing every part (MB).
`--dram-budget` stays the target-only knob; the two are mutually exclusive.
"""

from __future__ import annotations

import dataclasses

from pathlib import Path

from ..autoregressive import PREFILL_CHUNK
from ..errors import MemoryLimitError
from ..gguf.config import config_from_gguf
from ..gguf.file import GGUFFile
from ..gguf.registry import resolve_model
from ..store.manifest import StoreManifest
from ..values import cache_root, dtype_bytes
from . import rss
from ..store.residency import kv_note
from .plan import MemoryPlan, gguf_weight_bytes, kv_bytes, kv_layout_text, store_minimum

FLOAT_BYTES = 4


def pass_scratch_bytes(cfg, rows: int, logits_rows: int) -> int:
    """Bytes a forward of `rows` tokens allocates besides weights and KV: the
    float32 activations of a layer (residual, normed input, q/k/v, attention
    output, gate/up/down) and `logits_rows` float32 rows of logits with the
    two copies the sampling rules make of them."""
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    per_row = 4 * cfg.hidden_size + qkv + cfg.n_heads * cfg.head_dim + 3 * cfg.intermediate_size
    return rows * per_row * FLOAT_BYTES + 3 * logits_rows * cfg.vocab_size * FLOAT_BYTES


def kv_pass_rows(tree_rows: int) -> int:
    """Rows of the largest pass over a KV cache of a run whose largest tree pass
    has `tree_rows` rows: that or a prefill chunk (PREFILL_CHUNK), whichever is
    larger (it sizes the sliding-window layers: `residency.kv_layer_rows`)."""
    return max(PREFILL_CHUNK, int(tree_rows))


def _gguf_sizes(path, head_type: str = "stored"):
    """(ModelConfig, weight bytes) of a GGUF file loaded with `head_type`, from one parse of its header."""
    g = path if isinstance(path, GGUFFile) else GGUFFile(path)
    return config_from_gguf(g), gguf_weight_bytes(g, head_type)


def plan_run(limit, *, target_store=None, target_path=None, draft_path=None, kv_tokens: int,
             tree_rows: int, sampling: bool, dtype: str, prefetch_depth: int | str = "auto",
             baseline_bytes: int | None = None, draft_head: str = "stored",
             manifest=None, target_windowed_kv: bool = True) -> tuple[MemoryPlan, int | None]:
    """The plan of one run under `limit` (bytes or '868MB') and the target
    store's DRAM budget (bytes; None for an in-memory target).

    target_store: a store directory, or target_path: a GGUF loaded into DRAM.
    draft_path: the draft model's GGUF, a path or a parsed GGUFFile (None: no
    draft model, e.g. n-grams),
    loaded with its head as `draft_head` ("stored" or "q4_0").
    kv_tokens: KV rows per sequence (prompt + new tokens + tree); tree_rows:
    rows of the largest target pass (with the prefill's chunks, `kv_pass_rows`,
    it sizes the KV caches' sliding-window layers); sampling: logits rows are
    kept (greedy keeps one argmax per row).  prefetch_depth: the store's ring, an integer
    or "auto" (the minimum then holds the least auto ring; the slots auto adds
    come out of the store budget).  baseline_bytes: default this process's RSS
    on entry, before any header is parsed.  manifest: target_store's, when
    already read (lever.runtime reads it once per run).  target_windowed_kv:
    False when the target's layers run on a static-shape backend, whose KV
    cache keeps every row of every layer (its sliding-window layers are then
    counted at full length)."""
    baseline = rss.current_rss() if baseline_bytes is None else int(baseline_bytes)
    dbytes = dtype_bytes(dtype)
    pass_rows = kv_pass_rows(tree_rows)
    draft_weights = draft_kv = draft_scratch = 0
    draft_note = ""
    if draft_path is not None:
        dcfg, draft_weights = _gguf_sizes(draft_path, draft_head)
        draft_kv = kv_bytes(dcfg, kv_tokens, dbytes, pass_rows)
        draft_note = kv_note(dcfg, kv_tokens, pass_rows)
        # greedy drafting ranks rows with the native top-k head; sampling keeps logits rows
        draft_scratch = pass_scratch_bytes(dcfg, tree_rows, tree_rows if sampling else 0)
    if target_store is not None:
        manifest = manifest if manifest is not None else StoreManifest.load(target_store)
        if not target_windowed_kv:
            manifest = dataclasses.replace(manifest, config=full_kv_config(manifest.config))
        cfg = manifest.config
        minimum = store_minimum(manifest, dbytes, kv_tokens, prefetch_depth, kv_pass_rows=pass_rows)
    else:
        cfg, weights = _gguf_sizes(target_path)
        cfg = cfg if target_windowed_kv else full_kv_config(cfg)
        minimum = {"weights": weights, "kv_cache": kv_bytes(cfg, kv_tokens, dbytes, pass_rows)}
    scratch = pass_scratch_bytes(cfg, tree_rows, tree_rows if sampling else 0) + draft_scratch
    plan = MemoryPlan.build(limit, draft_weight_bytes=draft_weights, draft_kv_bytes=draft_kv,
                            target_minimum=minimum, target_scratch_bytes=scratch, baseline_bytes=baseline,
                            kv_tokens=kv_tokens, kv_layout=kv_layout_text(kv_note(cfg, kv_tokens, pass_rows), draft_note))
    return plan, (plan.store_budget_bytes if target_store is not None else None)


def memory_report(plan: MemoryPlan | None) -> dict:
    """The JSON `memory` object of a run: the plan (when a limit was given) and
    this process's RSS figures now (bytes; peak = the high-water mark)."""
    snap = rss.snapshot().to_dict()
    out = {"rss": snap, "peak_rss_bytes": snap["peak_rss_bytes"]}
    if plan is not None:
        out["plan"] = plan.summary()
        out["within_limit"] = snap["peak_rss_bytes"] <= plan.limit_bytes
    return out


def model_file(name: str | None, cache_dir) -> Path | None:
    """The GGUF file of a model name or path (None for no model or 'ngram');
    a checkpoint directory cannot be sized from a header and is refused."""
    if not name or name == "ngram":
        return None
    path = Path(resolve_model(name, cache_dir=cache_root(cache_dir), progress=True))
    if not path.is_file():
        raise MemoryLimitError(f"--memory-limit sizes models from their GGUF header; {path} is not a GGUF file")
    return path


def full_kv_config(cfg):
    """`cfg` as a KV cache that keeps every row of every layer sees it: its
    sliding-window layers counted as global (for sizing only)."""
    return dataclasses.replace(cfg, layer_kinds=cfg.layer_kinds.replace("l", "g"), sliding_window=0)
