"""Seeded, bounded fuzzing of the two formats Lever reads.

manifest.json: 100 JSON-aware mutations (digit edits, field removal, type
changes, swaps) of a tiny store's manifest. Each must either load and give
exactly the unmutated logits -- allowed only when the mutation left the
canonical content unchanged -- or raise one LeverError; never another
exception, never a hang. The same mutations with the checksum recomputed (a
forged manifest) must never crash either.

GGUF header: 100 byte flips and integer-field edits in the header and the
metadata section of a tiny GGUF. Each must raise one LeverError or load; a
loaded file must give the unmutated logits unless the mutation changed a
float hyperparameter to another valid value (rope base, RMS epsilon), which
no format check can tell from a real model.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time

import pytest

from lever.store.convert import convert
from lever.store.manifest import MANIFEST
from lever.store.manifest_json import CHECKSUM_FIELD, digest
from tiny_model import gguf_logits, header_fields, lever_error_of, store_logits, write_tiny_gguf

N_MUTATIONS = int(os.environ.get("LEVER_FUZZ_MUTATIONS", 100))    # per test; more for a deeper local run
SEED = int(os.environ.get("LEVER_FUZZ_SEED", 20261201))


# -- manifest.json ---------------------------------------------------------------------

def _paths(value, prefix=()):
    """Every (path, value) in a JSON tree, containers included."""
    yield prefix, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


def _at(raw, path):
    for k in path:
        raw = raw[k]
    return raw


def _digit_edit(rng, text):
    positions = [i for i, c in enumerate(text) if c.isdigit()]
    i = rng.choice(positions)
    return text[:i] + rng.choice("0123456789".replace(text[i], "")) + text[i + 1:]


def _remove_field(rng, raw):
    path, obj = rng.choice([(p, v) for p, v in _paths(raw) if isinstance(v, dict) and v])
    del obj[rng.choice(list(obj))]


def _change_type(rng, raw):
    path = rng.choice([p for p, _ in _paths(raw) if p])
    old = _at(raw, path)
    new = rng.choice([str(old), 1.5, True, None, [], {}, -1, 2**64, float(old) if type(old) is int else 0])
    _at(raw, path[:-1])[path[-1]] = new


def _swap(rng, raw):
    lists = [v for _, v in _paths(raw) if isinstance(v, list) and len(v) > 1]
    dicts = [v for _, v in _paths(raw) if isinstance(v, dict) and len(v) > 1]
    container = rng.choice(lists + dicts)
    keys = list(range(len(container))) if isinstance(container, list) else list(container)
    a, b = rng.sample(keys, 2)
    container[a], container[b] = container[b], container[a]


def mutate_manifest(rng: random.Random, text: str) -> str:
    kind = rng.choice(["digit", "remove", "type", "swap"])
    if kind == "digit":
        return _digit_edit(rng, text)
    raw = json.loads(text)
    {"remove": _remove_field, "type": _change_type, "swap": _swap}[kind](rng, raw)
    return json.dumps(raw, indent=1)


def _canonical(text):
    try:
        return digest(json.loads(text)), json.loads(text).get(CHECKSUM_FIELD)
    except (ValueError, AttributeError, TypeError, RecursionError):
        return None


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    g = write_tiny_gguf(d / "tiny.gguf", "qwen2", tied=False)
    return convert(str(g), d / "store", progress=False)


def outcome_of(load, expected) -> str:
    """Run `load` (which returns logits) once: "error" for one clear LeverError,
    else "same" or "different" against `expected`; any other exception
    propagates to the caller, which records it as a failure."""
    got = []
    if lever_error_of(lambda: got.append(load())) is not None:
        return "error"
    return "same" if bool((got[0] == expected).all()) else "different"


@pytest.mark.parametrize("reseal", [False, True], ids=["as-mutated", "resealed"])
def test_manifest_mutations(tiny_store, tmp_path, reseal):
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    original = (store / MANIFEST).read_text()
    expected = store_logits(store)
    rng = random.Random(SEED + reseal)
    t0, failures, outcomes = time.monotonic(), [], {"error": 0, "same": 0, "different": 0}
    for i in range(N_MUTATIONS):
        text = mutate_manifest(rng, original)
        if reseal:
            try:
                raw = json.loads(text)
                raw[CHECKSUM_FIELD] = digest(raw)
                text = json.dumps(raw)
            except (ValueError, TypeError, AttributeError):
                pass
        (store / MANIFEST).write_text(text)
        try:
            outcome = outcome_of(lambda: store_logits(store), expected)
        except Exception as e:         # noqa: BLE001 -- the point: nothing but LeverError
            failures.append(f"mutation {i}: {type(e).__name__}: {e}")
            continue
        outcomes[outcome] += 1
        if not reseal and outcome != "error" and _canonical(text) != _canonical(original):
            failures.append(f"mutation {i}: an edited manifest loaded ({outcome} output)")
    elapsed = time.monotonic() - t0      # shown, not asserted: a hang fails its own mutation (lever_error_of)
    print(f"manifest fuzz ({'resealed' if reseal else 'as mutated'}): {outcomes}, {elapsed:.1f} s")
    assert not failures, "\n".join(failures)
    assert outcomes["error"] >= N_MUTATIONS // 2


# -- GGUF header -------------------------------------------------------------------------

FLOAT_HYPERPARAMETERS = ("llama.rope.freq_base value", "llama.attention.layer_norm_rms_epsilon value")
_EDGE = [0, 1, 2, 3, 7, 31, 32, 33, 64, 255, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]


def mutate_gguf(rng: random.Random, data: bytearray, fields, header_end: int) -> str:
    """Mutate `data` in place; returns the label of the field touched ("" if none)."""
    if rng.random() < 0.5:
        pos = rng.randrange(header_end)
        data[pos] ^= 1 << rng.randrange(8)
        return next((label for label, off, size in fields if off <= pos < off + size), "")
    label, off, size = rng.choice(fields)
    old = int.from_bytes(data[off:off + size], "little")
    new = rng.choice(_EDGE + [old + 1, old - 1, old * 2, old // 2, rng.randrange(256 ** size)]) % 256 ** size
    data[off:off + size] = new.to_bytes(size, "little")
    return label


def test_gguf_header_mutations(tmp_path):
    pristine = write_tiny_gguf(tmp_path / "tiny.gguf")
    expected = gguf_logits(pristine)
    fields = header_fields(pristine)
    header_end = max(off + size for _, off, size in fields)
    original = pristine.read_bytes()
    rng = random.Random(SEED)
    t0, failures, outcomes = time.monotonic(), [], {"error": 0, "same": 0, "different": 0}
    bad = tmp_path / "bad.gguf"
    for i in range(N_MUTATIONS):
        data = bytearray(original)
        label = mutate_gguf(rng, data, fields, header_end)
        bad.write_bytes(bytes(data))
        try:
            outcome = outcome_of(lambda: gguf_logits(bad), expected)
        except Exception as e:         # noqa: BLE001
            failures.append(f"mutation {i} ({label or 'string bytes'}): {type(e).__name__}: {e}")
            continue
        outcomes[outcome] += 1
        if outcome == "different" and label not in FLOAT_HYPERPARAMETERS:
            failures.append(f"mutation {i} ({label or 'string bytes'}): loaded with different logits")
    elapsed = time.monotonic() - t0      # shown, not asserted: a hang fails its own mutation (lever_error_of)
    print(f"GGUF header fuzz: {outcomes}, {elapsed:.1f} s")
    assert not failures, "\n".join(failures)
