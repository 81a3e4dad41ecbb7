"""The decoding modes, each written once: its name, the policy that grows
its trees, the draft rows of its largest target pass, and what draft it needs.

    ar      the target alone
    chain   a chain of `draft_len` draft tokens (lever.draft.policies.ChainPolicy)
    tree    a static best-first tree of `tree.budget` nodes (StaticTreePolicy)
    lever   a tree sized per iteration by the gain-cost policy (lever.draft.gain_cost),
            made for the run by lever.mode_lever and carried in `SpecConfig.policy`

`MODES` is the registry every other place reads: the run configuration
(lever.config: checks, KV rows), the decode loop (lever.engine: the policy)
and the command line's --mode choices (lever.commands.options).  A new mode
is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .draft.policies import ChainPolicy, NoDraft, StaticTreePolicy


@dataclass(frozen=True)
class Mode:
    """name: the --mode value; policy(spec, vocab_size): the TreePolicy of a
    lever.engine.SpecConfig in this mode (vocab_size: the target's vocabulary,
    in tokens); draft_rows(decode): draft tokens (root excluded) of the
    largest pass a lever.config.DecodeConfig in this mode makes;
    needs_draft: a drafter (a draft model or prompt lookup); needs_draft_model:
    draft probabilities, which prompt lookup has not."""

    name: str
    policy: Callable
    draft_rows: Callable
    needs_draft: bool = True
    needs_draft_model: bool = False


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("ar", lambda spec, vocab_size: NoDraft(), lambda decode: 0, needs_draft=False),
    Mode("chain", lambda spec, vocab_size: ChainPolicy(spec.draft_len, spec.rule, vocab_size),
         lambda decode: decode.draft_len),
    Mode("tree", lambda spec, vocab_size: StaticTreePolicy(spec.tree), lambda decode: decode.tree.budget),
    Mode("lever", lambda spec, vocab_size: spec.policy, lambda decode: decode.lever_max_nodes,
         needs_draft_model=True),
)}
