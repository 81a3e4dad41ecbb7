"""Recording what an early-exit probe learns from (`lever probe record`).

Every greedy target pass over a draft tree is watched by a `TraceRecorder`
(a TargetVerifier pass hook that never prunes).  For each draft node j >= 1:
its prompt, policy, tree and node index, parent, token, draft log-prob,
sibling rank, depth, the labels

- ``match``: the target's argmax at j's parent is j's token (the node would
  be accepted if the walk reached its parent), and
- ``accepted``: j is on the accepted path of the greedy walk,

the lens score of j's token at each recorded layer (lever.probe.features),
and an index ``hrow`` into the parent hidden states of its tree pass: the
residual stream after each recorded decoder layer (0-based) of every node
that is a parent, as float16 [rows, layers, hidden].  Per tree: its draft
nodes, accepted count, the seconds drafting it (since the previous pass)
and the seconds of the pass (the first tree of each run: draft seconds nan,
its drafting is mixed with the prefills).

On disk (a directory): ``meta.json`` (format, target key, layers, hidden
size, corpus, policies, the prompts recorded with their shard) and one
``prompt-NNN.npz`` shard per prompt, plus ``profile.json`` (the device
profile mode lever ran with) when there is one.  Times are seconds.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic_write import SaveError, write_atomic, write_with
from ..autoregressive import kv_tokens
from ..engine import run_speculative
from ..errors import LeverError
from ..sampling import SamplingParams
from ..verify.target_pass import TargetVerifier
from .features import head_rows, lens_scores, sibling_ranks

TRACE_FORMAT = "lever-probe-traces"
TRACE_VERSION = 1
META = "meta.json"
PROFILE = "profile.json"
POLICIES = ("tree", "lever")          # "all nodes" of a static tree; the nodes lever's trees contain
NODE_FIELDS = ("tree", "prompt", "policy", "node", "parent", "token", "draft_logp", "rank", "depth",
               "match", "accepted", "hrow", "lens")
TREE_FIELDS = ("tree_prompt", "tree_policy", "tree_nodes", "tree_accepted", "tree_draft_s", "tree_pass_s")


class TraceError(LeverError):
    """A trace directory that is missing, incomplete or damaged."""


def default_layers(n_layers: int) -> list[int]:
    """Candidate probe layers: about L/4, L/3, L/2 and 3L/4 (0-based decoder
    layers; 7, 9, 14, 21 of 28), never the last layer when there are two or more."""
    top = max(0, n_layers - 2)
    return sorted({min(top, max(0, round(n_layers * f))) for f in (1 / 4, 1 / 3, 1 / 2, 3 / 4)})


class TraceRecorder:
    """A pass hook (lever.verify.target_pass.TargetVerifier) that records every
    greedy tree pass and prunes nothing.

    layers: decoder layers (0-based) after which parent hidden states are kept.
    norm_w, eps: the target's final norm weight and epsilon; head_rows_fn(tokens)
    -> float32 [m, hidden]: the dequantised head rows (for the lens).
    keep_hidden False: the shards hold no hidden states (lens only; hrow is -1)
    Call `start(prompt, policy)` before each run and `take()` after a prompt."""

    def __init__(self, layers, norm_w: np.ndarray, eps: float, head_rows_fn, keep_hidden: bool = True):
        self.layers = [int(k) for k in layers]
        if not self.layers or sorted(set(self.layers)) != self.layers:
            raise LeverError(f"recorded layers must be distinct and increasing, got {list(layers)}")
        self._slot = {k: i for i, k in enumerate(self.layers)}
        self.norm_w, self.eps, self.head_rows_fn = np.asarray(norm_w, dtype=np.float32), float(eps), head_rows_fn
        self.keep_hidden = keep_hidden
        self.prompt, self.policy = 0, 0
        self._clear()
        self._t_last = None

    def _clear(self) -> None:
        self._nodes: list[dict] = []
        self._trees: list[tuple] = []
        self._hidden: list[np.ndarray] = []
        self._n_rows = 0

    def start(self, prompt: int, policy: str) -> None:
        """The runs that follow are of prompt index `prompt` under `policy` (one of POLICIES)."""
        self.prompt, self.policy = int(prompt), POLICIES.index(policy)
        self._t_last = None          # the first tree's drafting is mixed with the prefills: not timed

    # -- the pass hook ----------------------------------------------------------------

    def begin(self, tree, n_cached: int):
        t = time.perf_counter()
        self._draft_s, self._t_begin = (t - self._t_last if self._t_last is not None else np.nan), t
        self._tree = tree
        self._rows = np.unique(np.asarray(tree.parents(), dtype=np.int64)[1:])
        self._h: dict[int, np.ndarray] = {}
        return self._layer_hook if len(tree) > 1 else None

    def _layer_hook(self, i: int, x: np.ndarray):
        slot = self._slot.get(i)
        if slot is not None:
            self._h[slot] = np.array(x[self._rows], dtype=np.float32)
        return None

    def finish(self, out):
        pass_s = time.perf_counter() - self._t_begin
        tree = self._tree
        if isinstance(out, tuple) or np.asarray(out).ndim not in (1, 2):
            raise LeverError("probe traces are recorded from greedy runs (argmax or logits outputs)")
        out = np.asarray(out)
        argmax = out if out.ndim == 1 else np.argmax(out, axis=-1)
        argmax = argmax.astype(np.int64)
        accepted, _ = tree.walk(argmax)
        n = len(tree)
        tree_id = len(self._trees)
        self._trees.append((self.prompt, self.policy, n - 1, len(accepted), self._draft_s, pass_s))
        if n > 1:
            self._record_nodes(tree, argmax, accepted, tree_id)
        self._t_last = time.perf_counter()
        return None

    def verdict(self, accepted: list[int], next_token: int) -> None:
        """The rule's outcome: nothing to add (finish() walked the same argmax ids:
        the recorder prunes nothing, so the verifier's walk is this one)."""

    def _record_nodes(self, tree, argmax: np.ndarray, accepted: list[int], tree_id: int) -> None:
        n = len(tree)
        if len(self._h) != len(self.layers):
            raise LeverError(f"the target ran no layer hook after layers {self.layers} (a torch reference "
                             f"target? record with the native decoder)")
        parents = np.asarray(tree.parents(), dtype=np.int64)[1:]
        tokens = np.asarray(tree.tokens(), dtype=np.int64)[1:]
        hrow_local = np.searchsorted(self._rows, parents)
        hidden = np.stack([self._h[s] for s in range(len(self.layers))], axis=1)     # [rows, L, H] float32
        rows = self.head_rows_fn(tokens)
        lens = np.stack([lens_scores(hidden[hrow_local, s], rows, self.norm_w, self.eps)
                         for s in range(len(self.layers))], axis=1)
        on_path = np.zeros(n, dtype=bool)
        on_path[np.asarray(accepted, dtype=np.int64)] = True
        self._nodes.append({
            "tree": np.full(n - 1, tree_id, dtype=np.int32), "prompt": np.full(n - 1, self.prompt, dtype=np.int32),
            "policy": np.full(n - 1, self.policy, dtype=np.int8), "node": np.arange(1, n, dtype=np.int16),
            "parent": parents.astype(np.int16), "token": tokens.astype(np.int32),
            "draft_logp": np.asarray(tree.logprobs(), dtype=np.float32)[1:],
            "rank": sibling_ranks(tree)[1:].astype(np.int16),
            "depth": np.asarray(tree.depths(), dtype=np.int16)[1:],
            "match": argmax[parents] == tokens, "accepted": on_path[1:],
            "hrow": (hrow_local + self._n_rows).astype(np.int32), "lens": lens.astype(np.float32)})
        if self.keep_hidden:
            self._hidden.append(hidden.astype(np.float16))
            self._n_rows += hidden.shape[0]
        else:
            self._nodes[-1]["hrow"][:] = -1

    # -- shards -----------------------------------------------------------------------

    def take(self, hidden_size: int) -> dict[str, np.ndarray]:
        """The arrays recorded since the last take (one shard), and forget them."""
        n_layers = len(self.layers)
        if self._nodes:
            shard = {f: np.concatenate([d[f] for d in self._nodes]) for f in NODE_FIELDS}
        else:
            shard = {f: np.zeros(0, dtype=np.int32) for f in NODE_FIELDS}
            shard["lens"] = np.zeros((0, n_layers), dtype=np.float32)
        shard["hidden"] = (np.concatenate(self._hidden) if self._hidden
                           else np.zeros((0, n_layers, hidden_size), dtype=np.float16))
        trees = list(zip(*self._trees)) if self._trees else [[]] * len(TREE_FIELDS)
        dtypes = (np.int32, np.int8, np.int32, np.int32, np.float64, np.float64)
        for f, col, dt in zip(TREE_FIELDS, trees, dtypes):
            shard[f] = np.asarray(col, dtype=dt)
        self._clear()
        return shard


def recorder_for(target, layers, keep_hidden: bool = True) -> TraceRecorder:
    """A TraceRecorder for a native target (NativeDecoder or StreamedDecoder)."""
    weights = getattr(target, "weights", None)
    if weights is None or not hasattr(weights, "head_rows") or not hasattr(weights, "layouts"):
        raise LeverError("probe traces need the native decoder (a GGUF or a flash store; not --kernels torch)")
    n_layers = target.config.n_layers
    bad = [k for k in layers if not 0 <= int(k) < n_layers]
    if bad:
        raise LeverError(f"--layers {','.join(map(str, bad))}: the target has decoder layers 0..{n_layers - 1}")
    return TraceRecorder(sorted(set(int(k) for k in layers)), weights.norm, target.config.rms_norm_eps,
                         lambda tokens: head_rows(weights, tokens), keep_hidden)


def record_traces(target, drafter, prompts: list[dict], out_dir, *, layers, new_tokens: int, specs: dict,
                  key: str, target_name: str, draft_name: str = "", corpus: str = "",
                  stop_ids: frozenset = frozenset(), profile=None, progress: bool = True,
                  keep_hidden: bool = True) -> dict:
    """Run every prompt (dicts with "ids", token ids, and "id"/"category") greedily
    for `new_tokens` tokens under each policy of `specs` ({POLICIES name:
    lever.engine.SpecConfig}), recording every tree pass; write one shard per
    prompt and meta.json (rewritten after each shard, so an interrupted recording
    keeps what it finished) to `out_dir`.  profile: the DeviceProfile of mode
    lever (saved as profile.json for `lever probe train`).  keep_hidden False:
    no hidden states in the shards (most of their size; the lens is kept).
    Returns the meta."""
    from tqdm import tqdm


    bad = [name for name in specs if name not in POLICIES]
    if bad:
        raise LeverError(f"unknown trace policy {bad[0]!r} (choose from {', '.join(POLICIES)})")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SaveError(out, e) from None
    recorder = recorder_for(target, layers, keep_hidden)
    cfg = target.config
    meta = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "key": key, "target": target_name,
            "draft": draft_name, "n_layers": cfg.n_layers, "hidden_size": cfg.hidden_size,
            "layers": recorder.layers, "corpus": corpus, "new_tokens": int(new_tokens),
            "policies": {name: describe_spec(spec) for name, spec in specs.items()},
            "hidden": bool(keep_hidden), "profile": None, "prompts": [], "complete": False}
    if profile is not None:
        _write_json(out / PROFILE, profile.to_json())
        meta["profile"] = PROFILE
    params = SamplingParams()
    bar = tqdm(total=len(prompts) * len(specs), desc="lever probe record", unit="run", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    try:
        for i, p in enumerate(prompts):
            tokens = 0
            for name, spec in specs.items():
                bar.set_postfix_str(f"{p.get('id', i)} {name}")
                capacity = kv_tokens(prompt_tokens=len(p["ids"]), new_tokens=new_tokens,
                                     extra=spec.max_tree_nodes + 2)
                verifier = TargetVerifier(target, params, capacity=capacity, pass_hook=recorder)
                recorder.start(i, name)
                result, _ = run_speculative(verifier, drafter, p["ids"], new_tokens, params, spec, stop_ids)
                tokens += len(result.token_ids)
                bar.update(1)
            shard = recorder.take(cfg.hidden_size)
            name = f"prompt-{i:03d}.npz"
            _write_npz(out / name, shard)
            meta["prompts"].append({"index": i, "id": p.get("id", str(i)), "category": p.get("category", ""),
                                    "shard": name, "trees": int(shard["tree_nodes"].size),
                                    "nodes": int(shard["node"].size), "tokens": tokens})
            _write_json(out / META, meta)
    finally:
        bar.close()
    meta["complete"] = True
    _write_json(out / META, meta)
    return meta


def describe_spec(spec) -> dict:
    """A policy's settings as JSON data (mode, tree shape or lever's limits)."""
    if spec.mode == "lever":
        p = spec.policy
        return {"mode": "lever", "max_nodes": p.max_nodes, "max_depth": p.max_depth, "topk": p.topk}
    if spec.mode == "tree":
        return {"mode": "tree", "budget": spec.tree.budget, "topk": spec.tree.topk, "depth": spec.tree.depth}
    return {"mode": spec.mode}


def _write_json(path: Path, data: dict) -> None:
    """Save `data` as JSON at `path`, atomically (SaveError naming it on failure)."""
    write_atomic(path, json.dumps(data, indent=1))


def _write_npz(path: Path, arrays: dict) -> None:
    """Save `arrays` as an .npz at `path`, atomically (SaveError naming it on failure)."""
    write_with(path, lambda f: np.savez(f, **arrays), suffix=".npz")


# -- reading ---------------------------------------------------------------------------

@dataclass
class Traces:
    """A trace directory loaded: meta.json, and every shard's node and tree
    fields concatenated (hidden states stay on disk: `hidden(shard)`).
    Tree ids are made global: nodes["tree"] indexes the tree arrays."""

    path: Path
    meta: dict
    nodes: dict
    trees: dict

    @property
    def layers(self) -> list[int]:
        return list(self.meta["layers"])

    @property
    def n_nodes(self) -> int:
        return int(self.nodes["node"].size)

    def hidden(self, shard: str) -> np.ndarray:
        """float16 [rows, layers, hidden] of one shard (indexed by that shard's hrow)."""
        with np.load(self.path / shard) as z:
            return z["hidden"]


def read_meta(trace_dir) -> dict:
    """meta.json of a trace directory, checked; TraceError otherwise."""
    d = Path(trace_dir)
    if d.exists() and not d.is_dir():
        raise TraceError(f"{d}: is a file, not a trace directory (--traces takes the directory that "
                         f"`lever probe record --out DIR` wrote)")
    if not d.is_dir():
        raise TraceError(f"{d}: no such trace directory (record one with `lever probe record`)")
    path = d / META
    if not path.is_file():
        raise TraceError(f"{d}: not a probe trace directory ({META} is missing; record one with `lever probe record`)")
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: cannot read it ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != TRACE_FORMAT:
        raise TraceError(f"{path}: not a probe trace meta file")
    if meta.get("version") != TRACE_VERSION:
        raise TraceError(f"{path}: trace format version {meta.get('version')!r}, this Lever reads "
                         f"{TRACE_VERSION}; record the traces again")
    for field_name in ("key", "layers", "prompts", "hidden_size"):
        if field_name not in meta:
            raise TraceError(f"{path}: the field {field_name!r} is missing")
    return meta


def load_traces(trace_dir) -> Traces:
    """Every shard listed in meta.json (an interrupted recording: those it
    finished); TraceError for a missing, damaged or empty directory."""
    d = Path(trace_dir)
    meta = read_meta(d)
    if not meta["prompts"]:
        raise TraceError(f"{d}: no prompt was recorded")
    node_parts: dict[str, list] = {f: [] for f in NODE_FIELDS}
    tree_parts: dict[str, list] = {f: [] for f in TREE_FIELDS}
    n_trees = 0
    n_layers = len(meta["layers"])
    for entry in meta["prompts"]:
        path = d / str(entry.get("shard", ""))
        try:
            with np.load(path) as z:
                shard = {f: z[f] for f in NODE_FIELDS + TREE_FIELDS}
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise TraceError(f"{path}: cannot read the shard ({e}); record the traces again") from None
        if shard["lens"].ndim != 2 or shard["lens"].shape[1] != n_layers:
            raise TraceError(f"{path}: lens of shape {shard['lens'].shape}, expected [nodes, {n_layers}]")
        shard["tree"] = shard["tree"].astype(np.int64) + n_trees
        n_trees += shard["tree_nodes"].size
        for f in NODE_FIELDS:
            node_parts[f].append(shard[f])
        for f in TREE_FIELDS:
            tree_parts[f].append(shard[f])
    nodes = {f: np.concatenate(v) for f, v in node_parts.items()}
    nodes["lens"] = nodes["lens"].reshape(-1, n_layers)
    trees = {f: np.concatenate(v) for f, v in tree_parts.items()}
    return Traces(d, meta, nodes, trees)
