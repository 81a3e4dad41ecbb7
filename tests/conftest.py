"""Shared fixtures: real models resolved through the registry (their packages
must be installed -- see README -- or these tests fail with the pip command)."""

import os
from pathlib import Path

import pytest

# Tests never reach a model hub: transformers reads only local files.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def lever_cache(tmp_path_factory) -> Path:
    """The cache that real models are assembled into ($LEVER_CACHE_DIR or a temp dir)."""
    env = os.environ.get("LEVER_CACHE_DIR")
    return Path(env) if env else tmp_path_factory.mktemp("lever-cache")


def _resolve(name: str, cache: Path) -> Path:
    from lever.gguf.registry import resolve_model
    return resolve_model(name, cache_dir=cache, progress=False)


@pytest.fixture(scope="session")
def smollm2_path(lever_cache) -> Path:
    return _resolve("smollm2-135m", lever_cache)


@pytest.fixture(scope="session")
def qwen05_path(lever_cache) -> Path:
    return _resolve("qwen2.5-coder-0.5b", lever_cache)


@pytest.fixture(scope="session")
def qwen15_path(lever_cache) -> Path:
    return _resolve("qwen2.5-coder-1.5b", lever_cache)
