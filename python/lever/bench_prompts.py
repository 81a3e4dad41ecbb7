"""The fixed, versioned benchmark prompt sets shipped with Lever (`lever/data/prompts_<version>.json`).

v1: 24 prompts -- 10 HumanEval coding tasks, 8 GSM8K math word problems and
6 written prose prompts, interleaved by category so that the first N are a
balanced mix (see bench/make_prompts.py for how the file was built).
"""

from __future__ import annotations

import importlib.resources
import json

from .errors import LeverError

CATEGORIES = ("code", "math", "prose")


def prompt_set(version: str = "v1") -> dict:
    """The whole prompt file: {"version", "note", "prompts": [{id, category, source, text}, ...]}."""
    res = importlib.resources.files("lever").joinpath("data", f"prompts_{version}.json")
    try:
        data = json.loads(res.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LeverError(f"no benchmark prompt set {version!r} (this Lever ships: {', '.join(versions())})") from None
    if data.get("version") != version:
        raise LeverError(f"prompt set file for {version!r} says it is version {data.get('version')!r}")
    return data


def versions() -> list[str]:
    """The prompt set versions shipped with this Lever."""
    d = importlib.resources.files("lever").joinpath("data")
    return sorted(p.name[len("prompts_"):-len(".json")] for p in d.iterdir()
                  if p.name.startswith("prompts_") and p.name.endswith(".json"))


def load_prompts(version: str = "v1", categories=None, limit: int | None = None) -> list[dict]:
    """Prompts of set `version`, in file order, optionally only those of `categories`
    (code, math, prose) and at most `limit` of them. Each: id, category, source, text."""
    prompts = prompt_set(version)["prompts"]
    if categories:
        wanted = [categories] if isinstance(categories, str) else list(categories)
        known = sorted({p["category"] for p in prompts})
        bad = [c for c in wanted if c not in known]
        if bad:
            raise LeverError(f"unknown prompt category {', '.join(map(repr, bad))} (choose from {', '.join(known)})")
        prompts = [p for p in prompts if p["category"] in wanted]
    if limit is not None:
        if limit < 1:
            raise LeverError(f"the number of prompts must be >= 1, got {limit}")
        prompts = prompts[:limit]
    return [dict(p) for p in prompts]
