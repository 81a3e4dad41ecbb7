"""Shared fixtures: real models resolved through the registry (their packages
must be installed -- see README -- or these tests fail with the pip command),
the SmolLM2 flash store and the tiny random native pair.

Tests are laid out like the package (tests/<area>/ for python/lever/<area>/,
tests/cli/ for lever.commands, tests/engine/ for the top-level run path,
tests/kernels/ for the native core), without __init__.py files: pytest puts
tests/ (this file's folder) on sys.path, so the helpers here (tiny_model.py,
vllm_stub.py) import by name, and every area folder is put there below, so a
test module imports another's helpers by its basename (`from test_speculative
import chi_square`) whichever files are run. Basenames are unique across areas.

Selection is by markers only (registered in pyproject.toml, --strict-markers):
slow, real, cross.

Tests never wait for a fixed stretch of wall-clock time: they wait for an event
or a condition through tests/waiting.py, whose limits are safety nets scaled by
$LEVER_TEST_TIME_SCALE (`deadline(seconds)`), so a loaded machine does not fail
them; speed is for the benchmarks."""

import os
import sys
from pathlib import Path

import pytest

# Tests never reach a model hub: transformers reads only local files.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TESTS = Path(__file__).resolve().parent
for _area in sorted(TESTS.iterdir()):
    if _area.is_dir() and any(_area.glob("test_*.py")) and str(_area) not in sys.path:
        sys.path.append(str(_area))


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
def gemma_path(lever_cache) -> Path:
    return _resolve("gemma-3-270m", lever_cache)


@pytest.fixture(scope="session")
def qwen15_path(lever_cache) -> Path:
    return _resolve("qwen2.5-coder-1.5b", lever_cache)


@pytest.fixture(scope="module")
def smol_store(smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2 (llama, tied head, Q4_1 blocks) converted to a flash store in its
    source block format; one per test module."""
    from lever.store.convert import convert
    return convert(str(smollm2_path), tmp_path_factory.mktemp("smol-store") / "store", progress=False)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """A 20-token-vocabulary native target with spread-out logits (model seed 137:
    the prompt-lookup draft is plausible, see test_speculative.exact_reference)
    and a noisy copy as draft; one pair per test module."""
    from tiny_model import native_pair
    return native_pair(tmp_path_factory.mktemp("tiny-pair"), "llama", False, seed=137, noise=0.2,
                       vocab=20, hidden=32, ff=64, heads=4, kv_heads=2, layers=1, context=128, std=0.2)
