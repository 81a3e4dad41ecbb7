"""The Python API as README.md documents it: `lever.generate` and
`lever.load(...).generate`, run as written (on SmolLM2-135M, a few tokens),
also after every other Lever module has been imported (a submodule once
shadowed the function `lever.generate`). Greedy output equals plain
autoregressive decoding; speculative output with a drafter equals the plain
one."""

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lever
from lever.api import LoadedModel, make_drafter
from lever.autoregressive import generate_tokens
from lever.draft.base import TreeShape
from lever.engine import SpecConfig
from lever.sampling import SamplingParams
from waiting import deadline

pytestmark = pytest.mark.real

README = Path(__file__).resolve().parents[2] / "README.md"
PROMPT = "Write a bubble sort in Python."
NEW = 8                        # tokens per generation: enough to compare, quick on two cores


@pytest.fixture(autouse=True)
def cache_env(lever_cache, monkeypatch):
    """The README's calls name no cache: point the default one at the test cache."""
    monkeypatch.setenv("LEVER_CACHE_DIR", str(lever_cache))


@pytest.fixture(scope="module")
def smol(lever_cache) -> LoadedModel:
    return lever.load("smollm2-135m", cache_dir=lever_cache, progress=False)


def plain_tokens(m: LoadedModel, prompt: str, n: int) -> list[int]:
    """Greedy tokens from the autoregressive loop itself, not through the API."""
    return generate_tokens(m.model, m.prompt_ids(prompt), n, SamplingParams(),
                           stop_ids=m.tokenizer.eos_token_ids).token_ids


def import_every_lever_module() -> list[str]:
    """Import all of lever's modules; those needing an absent optional package are skipped."""
    done = []
    for info in pkgutil.walk_packages(lever.__path__, "lever."):
        try:
            importlib.import_module(info.name)
        except ImportError as e:
            if (e.name or "").split(".")[0] == "lever":
                raise
            continue
        done.append(info.name)
    return done


def test_top_level_functions_survive_every_import():
    imported = import_every_lever_module()
    expected = {"lever.api", "lever.engine", "lever.autoregressive", "lever.cli", "lever.commands.generate"}
    assert expected <= set(imported)
    for name in ("generate", "load"):
        fn = getattr(lever, name)
        assert callable(fn) and fn.__module__ == "lever", (name, fn)


def test_fresh_interpreter_after_importing_the_api():
    code = ("import lever, lever.api, lever.engine, lever.autoregressive, lever.cli; "
            "assert callable(lever.generate) and callable(lever.load), lever.generate")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=deadline(120))


def readme_api_example() -> str:
    """The `import lever` Python block of README.md, with the length made small (its model,
    SmolLM2, is the one the README's first command installs)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    code = next(b for b in blocks if b.startswith("import lever\n"))
    assert 'lever.load("smollm2-135m"' in code and "max_new_tokens=64" in code, \
        "the README example changed: update this test"
    return code.replace("max_new_tokens=64", f"max_new_tokens={NEW}")


def test_readme_example_runs_as_written(smol, capsys):
    ns: dict = {}
    exec(compile(readme_api_example(), str(README), "exec"), ns)   # its own assert: speculative == plain
    printed = capsys.readouterr().out
    ref = plain_tokens(smol, PROMPT, NEW)
    m, out, fast = ns["m"], ns["out"], ns["fast"]
    assert isinstance(m, LoadedModel)
    assert out.token_ids == fast.token_ids == ref and len(ref) == NEW
    assert fast.spec is not None and fast.spec.iterations > 0
    assert out.text and out.text in printed
    timing = out.to_json()["timing"]
    assert {"load_s", "prefill_s", "decode_s", "decode_tokens_per_s"} <= set(timing)


def test_lever_generate_by_name_and_loaded(smol):
    ref = plain_tokens(smol, PROMPT, NEW)
    by_name = lever.generate(PROMPT, max_new_tokens=NEW)                    # the default model
    assert by_name.token_ids == ref
    assert by_name.text == smol.tokenizer.decode(ref, skip_special_tokens=True)
    assert lever.generate(PROMPT, model="smollm2-135m", max_new_tokens=NEW, temperature=0).token_ids == ref
    assert lever.generate(PROMPT, model=smol, max_new_tokens=NEW).token_ids == ref


@pytest.mark.parametrize("draft,spec", [
    ("ngram", SpecConfig("chain", draft_len=4)),
    ("ngram", SpecConfig("tree", tree=TreeShape(16, 4, 4))),
    ("smollm2-135m", SpecConfig("chain", draft_len=3)),
    ("smollm2-135m", SpecConfig("tree", tree=TreeShape(8, 2, 4))),
], ids=["ngram-chain", "ngram-tree", "model-chain", "model-tree"])
def test_speculative_equals_plain(smol, lever_cache, draft, spec):
    ref = plain_tokens(smol, PROMPT, NEW)
    drafter = make_drafter(draft, cache_dir=lever_cache, progress=False)
    out = smol.generate(PROMPT, max_new_tokens=NEW, temperature=0, drafter=drafter, spec=spec)
    assert out.token_ids == ref
    assert out.spec.iterations > 0
    assert out.to_json()["speculative"]


def test_a_drafter_without_a_spec_is_an_error(smol):
    """Not a silent plain run: one line naming the missing spec=SpecConfig(...)."""
    from lever.errors import LeverError
    with pytest.raises(LeverError) as e:
        smol.generate(PROMPT, max_new_tokens=NEW, drafter=make_drafter("ngram"))
    message = str(e.value)
    assert "spec=SpecConfig(" in message and "drafter" in message and "\n" not in message


def test_streamed_text_is_the_completion(smol):
    pieces = []
    out = smol.generate(PROMPT, max_new_tokens=NEW, on_text=pieces.append)
    assert "".join(pieces) == out.text


def test_seeded_sampling_is_reproducible(smol):
    a = smol.generate(PROMPT, max_new_tokens=NEW, temperature=0.8, top_p=0.9, top_k=40, seed=7)
    b = smol.generate(PROMPT, max_new_tokens=NEW, temperature=0.8, top_p=0.9, top_k=40, seed=7)
    assert a.token_ids == b.token_ids and len(a.token_ids) >= 1


@pytest.mark.parametrize("kwargs,field", [
    (dict(temperature=1e-300), "temperature"), (dict(temperature=float("inf")), "temperature"),
    (dict(top_p=1e-300), "top_p"), (dict(seed=-1), "seed"), (dict(seed=2**64), "seed"),
])
def test_out_of_range_sampling_is_a_value_error(smol, kwargs, field):
    with pytest.raises(ValueError, match=field):
        smol.generate(PROMPT, max_new_tokens=1, **kwargs)
