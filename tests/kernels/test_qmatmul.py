"""Native quantised matmul (`lever._native.quant_matmul`) against dequantise-then-matmul.

Two references:
  * tight: the weights dequantised (bit-exact to gguf) times the activations
    after the same 8-bit block quantisation the kernels apply (emulated here in
    numpy), in float64.  Only float summation order differs, so the error
    bound is 1e-3 of sum(|w| |x|) per output (a rounding tie resolved the other
    way in the emulation moves one term by d_x |w|, about 1e-4 of that sum).
  * loose: plain fp32 dequantise-then-matmul (what the torch path computes):
    the 8-bit activations cost about 0.5% relative error.
Every available instruction set is checked, and the scalar one is also forced
through LEVER_KERNEL_ISA in a subprocess.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lever import _native, quant
from lever.reference.linear import QuantTensor, linear, quant_matmul
from waiting import deadline

TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
# byte offsets of the fp16 scale fields in each block (random bytes elsewhere are valid)
FP16_FIELDS = {2: [0], 3: [0, 2], 6: [0], 8: [0], 12: [0, 2], 14: [208]}
ISAS = _native.available_isas()


def random_blocks(qtype: int, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    bs, ts = quant.block_size(qtype), quant.type_size(qtype)
    n_blocks = rows * cols // bs
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def quantize_like_kernel(x: np.ndarray, block: int) -> np.ndarray:
    """x after the kernels' activation quantisation (d = amax/127, round half away)."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
    v = (xb * inv).astype(np.float32)
    q = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
    d = (amax / np.float32(127.0)).astype(np.float32)
    return (q * d).reshape(x.shape)


def act_block(qtype: int) -> int:
    return 256 if qtype in (12, 14) else 32


def check(qtype, raw, rows, cols, x, isa):
    w = quant.dequantize(raw, qtype, (rows, cols), "float32").astype(np.float64)
    out = np.empty((x.shape[0], rows), dtype=np.float32)
    _native.quant_matmul(x, raw, qtype, out, isa)
    xq = quantize_like_kernel(x, act_block(qtype)).astype(np.float64)
    tight = xq @ w.T
    scale = np.abs(xq) @ np.abs(w).T + 1e-30
    err = np.abs(out - tight) / scale
    assert err.max() < 1e-3, f"{isa}: max error {err.max():.2e} of sum|w||x|"
    loose = x.astype(np.float64) @ w.T
    rel = np.linalg.norm(out - loose) / np.linalg.norm(loose)
    assert rel < 0.02, f"{isa}: relative error {rel:.3f} against fp32 dequantise-then-matmul"
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 256])
def test_matches_dequantize_then_matmul(name, isa, m):
    qtype = TYPES[name]
    rng = np.random.default_rng(qtype * 1000 + m)
    bs = quant.block_size(qtype)
    rows, cols = 37, 3 * bs if bs == 256 else 7 * bs      # odd row count, odd block count
    raw = random_blocks(qtype, rows, cols, rng)
    x = rng.standard_normal((m, cols)).astype(np.float32)
    check(qtype, raw, rows, cols, x, isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", list(TYPES))
def test_every_isa_agrees_and_rows_are_independent(name, isa):
    """A row's result does not depend on the other rows of the batch (so a token
    scores the same alone or inside a tree), and every Isa agrees with scalar."""
    qtype = TYPES[name]
    rng = np.random.default_rng(7 + qtype)
    bs = quant.block_size(qtype)
    rows, cols = 130, 2 * bs if bs == 256 else 28 * bs
    raw = random_blocks(qtype, rows, cols, rng)
    x = rng.standard_normal((64, cols)).astype(np.float32)
    full = np.empty((64, rows), np.float32)
    _native.quant_matmul(x, raw, qtype, full, isa)
    for i in (0, 5, 63):
        one = np.empty((1, rows), np.float32)
        _native.quant_matmul(x[i:i + 1], raw, qtype, one, isa)
        np.testing.assert_array_equal(one[0], full[i])
    scalar = np.empty_like(full)
    _native.quant_matmul(x, raw, qtype, scalar, "scalar")
    np.testing.assert_allclose(full, scalar, rtol=1e-4, atol=1e-4 * np.abs(scalar).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", list(TYPES))
def test_results_are_bitwise_independent_of_batch_and_tiling(name, isa):
    """Every (weight row, activation row) result is bit-identical whatever M is,
    where the activation row sits in the batch, and where the weight row sits
    among the weight rows (from 32 rows up the AVX-512 kernels tile both: up to
    4 weight rows x 16 activation rows, with remainders; fewer rows go one weight
    row at a time), so that exact speculative decoding can
    compare a token decoded alone with the same token verified inside a tree."""
    qtype = TYPES[name]
    rng = np.random.default_rng(100 + qtype)
    bs = quant.block_size(qtype)
    rows, cols = 67, 3 * bs if bs == 256 else 9 * bs    # 67 = 16 * 4 + 3: a partial weight tile
    row_bytes = cols // bs * quant.type_size(qtype)
    raw = random_blocks(qtype, rows, cols, rng)
    x = rng.standard_normal((256, cols)).astype(np.float32)
    full = np.empty((256, rows), np.float32)
    _native.quant_matmul(x, raw, qtype, full, isa)
    for m, start in ((1, 0), (1, 37), (7, 0), (7, 101), (64, 0), (64, 29), (40, 200), (17, 239)):
        part = np.empty((m, rows), np.float32)
        _native.quant_matmul(np.ascontiguousarray(x[start:start + m]), raw, qtype, part, isa)
        np.testing.assert_array_equal(part, full[start:start + m], err_msg=f"M={m} from row {start}")
    # Weight rows shifted by 1..5 against the weight tiles (and fewer of them).
    for skip in (1, 2, 3, 5):
        n = rows - skip - 2
        part = np.empty((64, n), np.float32)
        _native.quant_matmul(x[:64], raw[skip * row_bytes:(skip + n) * row_bytes], qtype, part, isa)
        np.testing.assert_array_equal(part, full[:64, skip:skip + n], err_msg=f"weight rows from {skip}")
    # One weight row at a time, for a few activation rows and for many.
    for r in (0, 30, 66):
        for first, m in ((5, 9), (3, 40)):
            one = np.empty((m, 1), np.float32)
            _native.quant_matmul(x[first:first + m], raw[r * row_bytes:(r + 1) * row_bytes], qtype, one, isa)
            np.testing.assert_array_equal(one[:, 0], full[first:first + m, r],
                                          err_msg=f"weight row {r} alone")


def test_special_activations():
    """All-zero rows give zeros; a single spike is carried exactly."""
    rng = np.random.default_rng(3)
    for qtype in TYPES.values():
        bs = quant.block_size(qtype)
        raw = random_blocks(qtype, 16, 2 * bs, rng)
        w = quant.dequantize(raw, qtype, (16, 2 * bs), "float32")
        x = np.zeros((2, 2 * bs), np.float32)
        x[1, 5] = 3.0
        for isa in ISAS:
            out = np.full((2, 16), np.nan, np.float32)
            _native.quant_matmul(x, raw, qtype, out, isa)
            np.testing.assert_array_equal(out[0], 0)
            np.testing.assert_allclose(out[1], 3.0 * w[:, 5], rtol=1e-5, atol=1e-7)


def test_bf16_in_and_out_and_strided_rows():
    rng = np.random.default_rng(11)
    qtype, rows, cols = 12, 40, 512
    raw = random_blocks(qtype, rows, cols, rng)
    qt = QuantTensor(raw, qtype, (rows, cols))
    x32 = torch.from_numpy(rng.standard_normal((5, cols)).astype(np.float32))
    ref = quant_matmul(x32.to(torch.bfloat16).float(), qt)
    got = quant_matmul(x32.to(torch.bfloat16), qt)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
    wide = torch.zeros(5, cols + 64)
    wide[:, :cols] = x32
    out = np.empty((5, rows), np.float32)
    _native.quant_matmul(wide.numpy()[:, :cols], raw, qtype, out)
    np.testing.assert_array_equal(out, quant_matmul(x32, qt).numpy())
    bias = torch.arange(rows, dtype=torch.float32)
    torch.testing.assert_close(linear(x32, qt, bias), quant_matmul(x32, qt) + bias)


@pytest.mark.real
def test_real_weights(qwen05_path):
    """Real Q5_0 / Q8_0 / Q4_K / Q6_K matrices (all four occur in the 0.5B GGUF)."""
    from lever.gguf.file import GGUFFile
    rng = np.random.default_rng(5)
    seen = set()
    g = GGUFFile(qwen05_path)
    for info in g.tensors.values():
        if len(info.shape) != 2 or info.qtype in seen or info.name.startswith(("token_embd", "output")):
            continue
        seen.add(info.qtype)
        rows, cols = info.shape
        raw = np.array(g.raw(info.name))
        x = rng.standard_normal((4, cols)).astype(np.float32)
        for isa in ISAS:
            check(info.qtype, raw, rows, cols, x, isa)
    assert {6, 8, 12, 14} <= seen


def test_bad_arguments():
    rng = np.random.default_rng(0)
    raw = random_blocks(12, 4, 256, rng)
    x = np.zeros((2, 256), np.float32)
    out = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="bytes"):
        _native.quant_matmul(x, raw[:-1], 12, out)
    with pytest.raises(ValueError, match="multiple of the block size"):
        _native.quant_matmul(np.zeros((2, 200), np.float32), raw, 12, out)
    with pytest.raises(ValueError, match="no quantised matmul kernel"):
        _native.quant_matmul(x, raw, 13, out)
    with pytest.raises(ValueError, match="rows"):
        _native.quant_matmul(x, raw, 12, np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="float32 or uint16"):
        _native.quant_matmul(x.astype(np.float64), raw, 12, out)
    with pytest.raises(ValueError, match="instruction set"):
        _native.quant_matmul(x, raw, 12, out, "sse9")
    with pytest.raises(ValueError, match="contiguous"):
        _native.quant_matmul(np.zeros((256, 2), np.float32).T, raw, 12, out)
    with pytest.raises(ValueError, match="needs"):
        QuantTensor(raw[:-1], 12, (4, 256))


def test_forced_scalar_run():
    """With LEVER_KERNEL_ISA=scalar the default ('auto') kernels are the scalar
    ones, and this module's tests pass on them."""
    env = dict(os.environ, LEVER_KERNEL_ISA="scalar")
    probe = subprocess.run([sys.executable, "-c", "from lever import _native; print(_native.kernel_isa())"],
                           env=env, capture_output=True, text=True, check=True, timeout=deadline(120))
    assert probe.stdout.strip() == "scalar"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                          "-k", "special or bf16_in or agrees", "-m", "not real"],
                         env=env, capture_output=True, text=True, timeout=deadline(600))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_bad_isa_environment():
    env = dict(os.environ, LEVER_KERNEL_ISA="neon9")
    run = subprocess.run([sys.executable, "-c", "from lever import _native; _native.kernel_isa()"],
                         env=env, capture_output=True, text=True, timeout=deadline(120))
    assert run.returncode != 0 and "unknown kernel instruction set" in run.stderr


ALL_ISAS = ("scalar", "avx2", "avx512", "neon", "dotprod", "i8mm")


@pytest.mark.parametrize("name", [n for n in ALL_ISAS if n not in ISAS])
def test_an_isa_this_cpu_cannot_run_is_refused(name):
    """Forcing an instruction set of the other architecture (or one this CPU
    lacks) is an error naming it, never a silent fallback to another kernel."""
    env = dict(os.environ, LEVER_KERNEL_ISA=name)
    run = subprocess.run([sys.executable, "-c", "from lever import _native; _native.kernel_isa()"],
                         env=env, capture_output=True, text=True, timeout=deadline(120))
    assert run.returncode != 0 and f"LEVER_KERNEL_ISA={name}: this CPU cannot run" in run.stderr
    with pytest.raises(ValueError, match="cannot run|not available"):
        _native.set_kernel_isa(name)


def test_every_isa_name_is_known():
    """The names the documentation lists are the ones the kernels accept."""
    try:
        for name in ALL_ISAS:
            if name in ISAS:
                _native.set_kernel_isa(name)
                assert _native.kernel_isa() == name
    finally:
        _native.set_kernel_isa("auto")
    with pytest.raises(ValueError, match="neon, dotprod, i8mm"):
        _native.set_kernel_isa("sve")
