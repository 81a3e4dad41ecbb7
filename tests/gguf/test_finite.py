"""Non-finite weights are refused (issue 42, part 4): a NaN or an infinity in
a norm or in a quantised block's F16 scale gives one `lever: error:` line
naming the file and the tensor, and no output text, whether the GGUF is
loaded into memory (`lever generate`) or converted into a store
(`lever convert`); a store altered after conversion is caught by its
checksums before any token is produced."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from lever import _native
from lever.cli import main
from lever.errors import ModelFormatError
from lever.gguf.file import GGUFFile
from lever.gguf.finite import DENSE, QUANT_SCALES, check_finite, nonfinite_counts
from lever.quant import dequantize
from lever.store.manifest import WEIGHTS, StoreManifest

F16_NAN, F16_INF, F16_FILL = 0x7E00, 0x7C00, 0x1111          # 0x1111: a small finite F16


# -- the bit test against the native dequantiser --------------------------------------

@pytest.mark.parametrize("qtype", sorted(QUANT_SCALES))
@pytest.mark.parametrize("special", [F16_NAN, F16_INF], ids=["nan", "inf"])
def test_scale_offsets_are_where_dequantisation_reads_floats(qtype, special):
    """For every 2-byte field of a block: a non-finite F16 written there makes
    the dequantised block non-finite exactly when the check reports it (the
    table of scale offsets agrees with the native dequantiser)."""
    assert qtype in _native.supported_types(), f"type {qtype} has scale offsets but no native dequantiser"
    block_bytes, _ = QUANT_SCALES[qtype]
    elements = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32}.get(qtype, 256)
    for offset in range(0, block_bytes, 2):
        block = np.full(block_bytes // 2, F16_FILL, dtype="<u2")
        block[offset // 2] = special
        raw = block.view(np.uint8)
        values = dequantize(raw, qtype, (elements,), "float32")
        flagged = sum(nonfinite_counts(raw, qtype)) > 0
        assert flagged == (not np.isfinite(values).all()), (qtype, offset)


@pytest.mark.parametrize("qtype,dtype", [(0, np.float32), (1, np.float16)])
def test_dense_values_are_counted(qtype, dtype):
    x = np.ones(100, dtype=dtype)
    x[[3, 50, 99]] = np.nan
    x[7] = -np.inf
    assert nonfinite_counts(x.view(np.uint8), qtype) == (3, 1)
    assert nonfinite_counts(np.ones(100, dtype=dtype).view(np.uint8), qtype) == (0, 0)


def test_bf16_values_are_counted():
    x = np.ones(64, dtype=np.float32)
    x[[1, 2]] = np.nan
    x[5] = np.inf
    bf16 = (x.view(np.uint32) >> 16).astype("<u2")
    assert nonfinite_counts(bf16.view(np.uint8), 30) == (2, 1)
    assert set(DENSE) == {0, 1, 30}


def test_error_names_file_tensor_and_count():
    x = np.ones(32, dtype=np.float32)
    x[:16] = np.nan
    with pytest.raises(ModelFormatError) as e:
        check_finite("m.gguf", "blk.5.attn_norm.weight", x.view(np.uint8), 0)
    assert str(e.value).startswith("m.gguf: tensor 'blk.5.attn_norm.weight' holds NaN (16 values)")


# -- the real model, damaged --------------------------------------------------------

@pytest.fixture(scope="module")
def damaged(smollm2_path, tmp_path_factory):
    """A copy of SmolLM2 and a function that damages it: (name, element index,
    bytes) written at the tensor's offset; undone after each test."""
    path = tmp_path_factory.mktemp("nonfinite") / "smol.gguf"
    shutil.copyfile(smollm2_path, path)
    return path


@pytest.fixture
def damage(damaged):
    g = GGUFFile(damaged)
    saved = []

    def write(name: str, byte_offset: int, data: bytes) -> None:
        at = g.tensors[name].offset + byte_offset
        with open(damaged, "r+b") as f:
            f.seek(at)
            saved.append((at, f.read(len(data))))
            f.seek(at)
            f.write(data)

    yield write
    with open(damaged, "r+b") as f:
        for at, old in reversed(saved):
            f.seek(at)
            f.write(old)


def one_error(rc, out, err) -> str:
    """The one `lever: error:` line of stderr (a progress bar aside), with exit status 2 and no output."""
    lines = [x for x in err.splitlines() if x.startswith("lever: ") or "Traceback" in x]
    assert rc == 2 and out == "", (rc, out, err)
    assert len(lines) == 1 and lines[0].startswith("lever: error: "), err
    return lines[0]


def generate(capsys, model, cache, *extra):
    rc = main(["generate", "--model", str(model), "--prompt", "The capital of France is", "-n", "8",
               "--temperature", "0", "--cache-dir", str(cache), *extra])
    c = capsys.readouterr()
    return rc, c.out, c.err


NAN32, INF32 = np.float32(np.nan).tobytes(), np.float32(np.inf).tobytes()


@pytest.mark.parametrize("value,word", [(NAN32, "NaN"), (INF32, "Inf")], ids=["nan", "inf"])
def test_output_norm_non_finite_is_refused_at_load(capsys, damaged, damage, tmp_path, value, word):
    damage("output_norm.weight", 4 * 10, value)
    line = one_error(*generate(capsys, damaged, tmp_path))
    assert f"{damaged}: tensor 'output_norm.weight' holds {word} (1 value)" in line


def test_sixteen_nans_in_a_layer_norm_are_refused(capsys, damaged, damage, tmp_path):
    damage("blk.5.attn_norm.weight", 0, NAN32 * 16)
    line = one_error(*generate(capsys, damaged, tmp_path, "--json"))
    assert "tensor 'blk.5.attn_norm.weight' holds NaN (16 values)" in line


def test_nan_block_scale_is_refused_at_load(capsys, damaged, damage, tmp_path):
    g = GGUFFile(damaged)
    name = "blk.3.attn_q.weight"
    block_bytes, offsets = QUANT_SCALES[g.tensors[name].qtype]
    damage(name, 7 * block_bytes + offsets[0], np.uint16(F16_NAN).tobytes())
    line = one_error(*generate(capsys, damaged, tmp_path, "--mode", "lever", "--draft", str(damaged)))
    assert f"tensor '{name}' holds NaN (1 block scale)" in line


@pytest.mark.parametrize("where", ["norm", "scale"])
def test_convert_refuses_non_finite_weights_and_leaves_nothing(capsys, damaged, damage, tmp_path, where):
    if where == "norm":
        name, at, data = "output_norm.weight", 0, INF32
    else:
        name = "blk.0.ffn_down.weight"
        block_bytes, offsets = QUANT_SCALES[GGUFFile(damaged).tensors[name].qtype]
        name, at, data = name, 2 * block_bytes + offsets[-1], np.uint16(F16_NAN).tobytes()
    damage(name, at, data)
    out = tmp_path / "out" / "store"
    rc = main(["convert", str(damaged), "--out", str(out)])
    c = capsys.readouterr()
    line = one_error(rc, c.out, c.err)
    assert f"tensor '{name}' holds" in line
    assert list((tmp_path / "out").iterdir()) == []          # no store, no temporary directory


def test_store_altered_after_conversion_gives_no_output(capsys, damaged, tmp_path):
    """A store is made only of checked weights; one whose bytes change later
    (a NaN written into the final norm) fails its checksum at the first pass:
    one error line, no text."""
    store = tmp_path / "store"
    assert main(["convert", str(damaged), "--out", str(store)]) == 0
    capsys.readouterr()
    m = StoreManifest.load(store)
    globals_extent = next(e for e in m.extents if e.name == "globals")
    norm = next(t for t in globals_extent.tensors if t.name == "norm.weight")
    with open(store / WEIGHTS, "r+b") as f:
        f.seek(globals_extent.offset + norm.offset)
        f.write(NAN32 * 4)
    rc = main(["generate", "--target-store", str(store), "--prompt", "The capital of France is", "-n", "8",
               "--temperature", "0", "--cache-dir", str(tmp_path)])
    c = capsys.readouterr()
    line = one_error(rc, c.out, c.err)
    assert "checksum" in line


def test_torch_reference_refuses_non_finite_weights(damaged, damage):
    pytest.importorskip("torch")
    from lever.model.loading import load_model
    damage("blk.1.ffn_norm.weight", 8, NAN32 * 2)
    with pytest.raises(ModelFormatError, match=r"tensor 'blk.1.ffn_norm.weight' holds NaN \(2 values\)"):
        load_model(damaged, "float32", kernels="torch")


def test_draft_head_requantised_at_load_is_checked_too(capsys, damaged, damage, tmp_path):
    """`--draft-head q4_0` reads the tied Q8_0 head chunk by chunk into Q4_0:
    a NaN scale in its last chunk is still refused, counted over all chunks."""
    g = GGUFFile(damaged)
    info = g.tensors["token_embd.weight"]
    block_bytes, offsets = QUANT_SCALES[info.qtype]
    last = info.nbytes // block_bytes - 1
    damage("token_embd.weight", offsets[0], np.uint16(F16_NAN).tobytes())
    damage("token_embd.weight", last * block_bytes + offsets[0], np.uint16(F16_INF).tobytes())
    rc, out, err = generate(capsys, "smollm2-135m", tmp_path, "--mode", "lever", "--draft", str(damaged),
                            "--draft-head", "q4_0")
    line = one_error(rc, out, err)
    assert f"{damaged}: tensor 'token_embd.weight' holds NaN (1 block scale) and Inf (1 block scale)" in line
