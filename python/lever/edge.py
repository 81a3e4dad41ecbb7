"""Edge-cloud generation: a draft model on this device, the target behind a
verifier server (`lever serve-verifier`) or an unmodified vLLM
OpenAI-compatible server (engine="vllm", lever.remote.vllm_verifier).

    from lever.edge import RemoteTarget
    remote = RemoteTarget("http://127.0.0.1:8000", draft="qwen2.5-coder-0.5b")
    out = remote.generate("Write a quicksort in Python.", max_new_tokens=64)
    print(out.text, out.remote["target_calls_per_token"])

    vllm = RemoteTarget("http://127.0.0.1:8001", draft="qwen2.5-coder-0.5b", engine="vllm")

Modes: "ar" (target-only remote decoding: one target call per token),
"chain" (k drafted tokens), "tree" (a static tree) and "lever" (each tree
sized by expected tokens per second, with the measured round trip plus the
server's pass as the verification cost -- lever.remote.cost).  On vLLM
only a tree's best path (or best `branches` paths) is verified, so mode
lever grows chains (topk 1), costed by round trips measured at start-up.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from .config import DecodeConfig, RemoteConfig, TargetConfig
from .cost.identity import model_identity
from .cost.measure import forward_seconds
from .draft.gain_cost import GainCostPolicy
from .draft.model_drafter import ModelDrafter
from .errors import LeverError
from .loaded import Completion, LoadedModel
from .mode_lever import calibrated_policy, sampling_key, save_calibration
from .runtime import connect, load_in_memory
from .sampling import SamplingParams
from .shapes import LeverLimits, TreeShape
from .values import cache_root
from .remote.client import RemoteVerifier
from .remote.cost import RemoteCost
from .remote.vllm_verifier import TOKENIZER_PROBE, VllmVerifier

DRAFT_GRID = [1, 2, 4, 8, 16, 32, 64]       # draft forward sizes measured for mode lever


class RemoteTarget:
    """The target of a verifier server at `url`, drafted for by `draft` (a
    registered name, a path, or a loaded model) on this device.

    token: the server's bearer token; mode: ar | chain | tree | lever;
    draft_len: chain length; tree: the static tree of mode tree;
    max_nodes / max_depth / topk: mode lever's tree limits;
    retry_deadline_s: seconds to keep retrying one call -- an open, or a
    round with its session rebuilds -- after its first failure (then the
    generation stops with a RemoteVerifierError, keeping its tokens);
    timeout_s: seconds one HTTP exchange may take (a call ends within
    timeout_s + retry_deadline_s);
    call_cost_s: mode lever counts each target call as this many extra
    seconds when sizing trees (fewer server calls for some speed; 0 = speed);
    tls_ca: PEM file of the certificates to trust for an https:// url
    (default: the system's), e.g. a self-signed server's certificate.
    draft_ahead: the draft extends the tree while the server verifies it
    (lever.draft.ahead), reused when the server accepts that path.
    engine: "lever" (`lever serve-verifier`) or "vllm" (a vLLM OpenAI-compatible
    server; greedy, or temperature 1 with top_p 1 and top_k 0);
    remote_model: vLLM's served model name (default: the only one);
    branches: vLLM only: the tree's best paths sent per request (greedy)."""

    def __init__(self, url: str, draft: str | LoadedModel = "qwen2.5-coder-0.5b", token: str | None = None,
                 mode: str = "lever", draft_len: int = 4, tree: TreeShape = TreeShape(),
                 max_nodes: int = LeverLimits.max_nodes, max_depth: int = LeverLimits.max_depth,
                 topk: int = LeverLimits.topk,
                 retry_deadline_s: float = 30.0, call_cost_s: float = 0.0, cache_dir=None, progress: bool = True,
                 tls_ca: str | None = None, timeout_s: float = 120.0, draft_ahead: bool = False,
                 engine: str = "lever", remote_model: str | None = None, branches: int = 1):
        self.remote = RemoteConfig(url, engine=engine, model=remote_model, branches=branches, token=token,
                                   tls_ca=tls_ca, timeout_s=timeout_s, retry_deadline_s=retry_deadline_s,
                                   call_cost_s=call_cost_s)
        self.draft = draft if isinstance(draft, LoadedModel) else \
            load_in_memory(TargetConfig(model=draft), cache_dir, progress=progress)
        self.decode = DecodeConfig(mode=mode, draft_len=draft_len, tree=tree, draft_ahead=draft_ahead)
        self.max_nodes, self.max_depth, self.topk = max_nodes, max_depth, topk
        self.cache_dir, self.progress = cache_dir, progress
        probe = self._connect(SamplingParams())
        self.info = probe.info
        if self.remote.engine == "vllm":
            probe.check_tokenizer(self.draft.tokenizer)
            if mode == "lever":
                self.topk = 1                     # only a path is verified: grow chains
                self.info["verify_cost"] = probe.measure_cost(self.draft.tokenizer.encode(TOKENIZER_PROBE))
        else:
            probe.check_tokenizer(self.draft.tokenizer.fingerprint())
        if self.draft.config.vocab_size > probe.vocab_size:
            raise LeverError(f"the draft's vocabulary ({self.draft.config.vocab_size}) is larger than the "
                             f"verifier's target's ({probe.vocab_size})")
        self.drafter = ModelDrafter(self.draft.model, path=self.draft.path) if mode != "ar" else None
        self._draft_curve: list[float] | None = None
        self.policy: GainCostPolicy | None = None
        self._policy_sampling = None
        # vLLM's cost curve is measured round trips: the network is inside it
        self.network_s = (0.0 if self.remote.engine == "vllm" else probe.ping_s()) if mode == "lever" else None
        probe.close()

    @classmethod
    def from_config(cls, remote: RemoteConfig, decode: DecodeConfig, draft: str | LoadedModel, *,
                    cache_dir=None, progress: bool = True) -> RemoteTarget:
        """The edge client of a typed configuration (`lever generate --remote`):
        the server of `remote`, the mode, trees and drafting ahead of `decode`."""
        return cls(remote.url, draft=draft, token=remote.token, mode=decode.mode, draft_len=decode.draft_len,
                   tree=decode.tree, max_nodes=decode.lever_max_nodes, max_depth=decode.lever_max_depth,
                   topk=decode.lever_topk, retry_deadline_s=remote.retry_deadline_s, call_cost_s=remote.call_cost_s,
                   cache_dir=cache_dir, progress=progress, tls_ca=remote.tls_ca, timeout_s=remote.timeout_s,
                   draft_ahead=decode.draft_ahead, engine=remote.engine, remote_model=remote.model,
                   branches=remote.branches)

    def _connect(self, params: SamplingParams) -> RemoteVerifier | VllmVerifier:
        return connect(self.remote, params, vocab_size=self.draft.config.vocab_size)

    def _lever_policy(self, params: SamplingParams, verifier: RemoteVerifier) -> GainCostPolicy:
        """The gain-cost policy with this link's cost, kept across generations
        (per sampling setting, like its calibration file)."""
        key = sampling_key(params)
        if self.policy is None or self._policy_sampling != key:
            if self._draft_curve is None:
                say = (lambda line: print(line, file=sys.stderr, flush=True)) if self.progress else (lambda _: None)
                self._draft_curve = forward_seconds(self.draft.model, DRAFT_GRID, ctx=128, repeats=3,
                                                    rng=np.random.default_rng(0), say=say)
            cost = RemoteCost(self.info.get("verify_cost") or {}, DRAFT_GRID, self._draft_curve, self.network_s,
                              call_cost_s=self.remote.call_cost_s)
            max_nodes = min(self.max_nodes, verifier.max_tree_nodes - 1)
            path = remote_calibration_path(self.info, self.draft.path, params, self.cache_dir)
            self.policy = calibrated_policy(cost, path, max_nodes=max_nodes, max_depth=self.max_depth,
                                            topk=self.topk)
            self._policy_sampling = key
        else:
            self.policy.cost.revision += 1          # re-read: the link may have changed between runs
        return self.policy

    def generate(self, prompt: str, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, chat: bool = True, on_text=None,
                 prompt_ids: list[int] | None = None, ignore_eos: bool = False) -> Completion:
        """Generate with the server's target; the output is exactly the target's.
        The returned Completion carries `remote`: target calls, bytes, round trips.
        prompt_ids: token ids to use instead of encoding `prompt`; ignore_eos: do not stop at
        end-of-sequence."""
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        verifier = self._connect(params)
        policy = self._lever_policy(params, verifier) if self.decode.mode == "lever" else None
        if policy is not None:
            verifier.cost = policy.cost
        spec = self.decode.spec(policy=policy)
        try:
            completion = self.draft.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                                             top_p=top_p, top_k=top_k, seed=seed, chat=chat, on_text=on_text,
                                             drafter=self.drafter, spec=spec, verifier=verifier,
                                             prompt_ids=prompt_ids, ignore_eos=ignore_eos)
        except LeverError as e:
            partial = getattr(e, "partial_result", None)
            if partial is not None:
                e.partial_text = self.draft.tokenizer.decode(partial.token_ids, skip_special_tokens=True)
                e.remote = verifier.stats.to_json(len(partial.token_ids))
            raise
        finally:
            verifier.close()
            if policy is not None:
                save_calibration(policy)
        completion.remote = verifier.stats.to_json(len(completion.token_ids))
        if policy is not None:
            completion.remote["cost"] = policy.cost.summary()
        return completion


def remote_calibration_path(info: dict, draft_path, params: SamplingParams, cache_dir=None) -> Path:
    """The acceptance calibration of (the server's target, this draft, the sampling setting)."""
    key = {"target": {"remote": info.get("model"), "tokenizer": info.get("tokenizer"),
                      **({"engine": "vllm"} if info.get("engine") == "vllm" else {})},
           "draft": model_identity(draft_path), "sampling": sampling_key(params)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "profiles" / f"calibration-remote-{digest}.json"
