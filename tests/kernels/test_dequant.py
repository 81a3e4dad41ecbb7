"""Native GGUF dequantisation (lever._native / lever.quant) against the numpy
reference `gguf.quants.dequantize`: bit-exact fp32, and bf16 equal to torch's
fp32 -> bf16 rounding of the reference."""

from __future__ import annotations

import os
import signal
import threading

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize as ref_dequantize
from gguf.quants import quantize as ref_quantize

import lever._native as native
from lever import quant
from lever.errors import UnsupportedModelError
from waiting import deadline

SUPPORTED = [T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.BF16]

# Byte offsets, within one block, of the fp16 scale fields (d, m, dmin).
SCALE_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
}
# Types that gguf.quants can also quantise (gives realistic blocks).
QUANTISABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16]

# One parallel task covers at least 64 Ki elements (dequant.cpp), so the last
# size spreads over several tasks and threads; all sizes are odd block counts
# except 1.
_GRAIN_ELEMENTS = 64 * 1024


def block_counts(qtype) -> list[int]:
    bs = GGML_QUANT_SIZES[qtype][0]
    return [1, 7, 33, 5 * _GRAIN_ELEMENTS // bs + 1]


CASES = [(qt, n) for qt in SUPPORTED for n in block_counts(qt)]
CASE_IDS = [f"{qt.name}-{n}blocks" for qt, n in CASES]


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}threads")
def threads(request):
    before = native.get_num_threads()
    native.set_num_threads(request.param)
    assert native.get_num_threads() == request.param
    yield request.param
    native.set_num_threads(before)


def random_finite_fp16(rng, n: int) -> np.ndarray:
    """n random fp16 bit patterns: any sign, normal, subnormal or zero; never inf/NaN."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= np.uint16(0xBFFF)  # clear the top exponent bit
    return bits


def random_blocks(qtype, n_blocks: int, seed: int) -> np.ndarray:
    """n_blocks random blocks of qtype as flat uint8; scales finite, everything else random."""
    rng = np.random.default_rng(seed)
    bs, ts = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        # Random bit patterns (incl. NaN, inf, subnormals), plus the edge cases.
        bits = rng.integers(0, 1 << 32, size=n_blocks, dtype=np.uint32)
        special = np.array([0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00008000,
                            0x00018000, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7FFFFF,
                            0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF],
                           dtype=np.uint32)
        k = min(n_blocks, special.size)
        bits[:k] = special[:k]
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for offset in SCALE_FIELDS.get(qtype, ()):
        raw[:, offset:offset + 2] = random_finite_fp16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def reference_bf16(ref: np.ndarray) -> np.ndarray:
    return torch.from_numpy(ref).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def assert_bf16_matches(out: np.ndarray, ref: np.ndarray) -> None:
    """out (bf16 bits) equals torch's rounding of ref, except that any NaN may be any NaN."""
    expected = reference_bf16(ref)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(out[~nan], expected[~nan])
    assert np.all((out[nan] & 0x7FFF) > 0x7F80), "NaN input must give a bf16 NaN"


def native_f32(raw: np.ndarray, qtype) -> np.ndarray:
    n = raw.size // GGML_QUANT_SIZES[qtype][1] * GGML_QUANT_SIZES[qtype][0]
    out = np.full(n, np.uint32(0xDEADBEEF)).view(np.float32)  # poison: every value must be written
    native.dequantize(raw, int(qtype), out)
    return out


def native_bf16(raw: np.ndarray, qtype) -> np.ndarray:
    n = raw.size // GGML_QUANT_SIZES[qtype][1] * GGML_QUANT_SIZES[qtype][0]
    out = np.full(n, 0xDEAD, dtype=np.uint16)
    native.dequantize(raw, int(qtype), out)
    return out


# --- random blocks --------------------------------------------------------------

@pytest.mark.parametrize("qtype,n_blocks", CASES, ids=CASE_IDS)
def test_f32_bit_exact(qtype, n_blocks, threads):
    raw = random_blocks(qtype, n_blocks, seed=n_blocks * 100 + int(qtype))
    ref = ref_dequantize(raw, qtype).reshape(-1)
    out = native_f32(raw, qtype)
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype,n_blocks", CASES, ids=CASE_IDS)
def test_bf16_is_rounded_reference(qtype, n_blocks, threads):
    raw = random_blocks(qtype, n_blocks, seed=n_blocks * 100 + int(qtype))
    ref = ref_dequantize(raw, qtype).reshape(-1)
    assert_bf16_matches(native_bf16(raw, qtype), ref)


def native_f16(raw: np.ndarray, qtype) -> np.ndarray:
    n = raw.size // GGML_QUANT_SIZES[qtype][1] * GGML_QUANT_SIZES[qtype][0]
    out = np.full(n, 0xDEAD, dtype=np.uint16).view(np.float16)
    native.dequantize(raw, int(qtype), out)
    return out


def assert_same_f16(out: np.ndarray, ref: np.ndarray) -> None:
    """Bit for bit numpy's astype(float16) (round to nearest even), NaN for NaN."""
    with np.errstate(over="ignore"):
        want = ref.astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("qtype,n_blocks", CASES, ids=CASE_IDS)
def test_f16_is_rounded_reference(qtype, n_blocks, threads):
    """float16 output (the NPU graphs' weights) is the fp32 dequantisation rounded as numpy rounds."""
    raw = random_blocks(qtype, n_blocks, seed=n_blocks * 100 + int(qtype))
    assert_same_f16(native_f16(raw, qtype), ref_dequantize(raw, qtype).reshape(-1))


def test_f16_rounding_edges():
    """Overflow to infinity from 65520 up, ties to even, subnormals, signed zeros, NaN."""
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.996, 65520.0, -65520.0, 1e6,
                      2.0 ** -14, 2.0 ** -15 * 1.5, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 3 * 2.0 ** -26,
                      1e-30, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, -1.0 - 2.0 ** -11], dtype=np.float32)
    rng = np.random.default_rng(7)
    spread = (rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000)).astype(np.float32)
    values = np.concatenate([edges, spread])
    assert_same_f16(native_f16(values.view(np.uint8), T.F32), values)


@pytest.mark.parametrize("qtype", QUANTISABLE, ids=lambda t: t.name)
@pytest.mark.parametrize("n_blocks", [1, 33, 5 * _GRAIN_ELEMENTS // 32 + 1])
def test_blocks_from_gguf_quantize(qtype, n_blocks, threads):
    """Realistic blocks: normal-distributed weights quantised by gguf itself."""
    bs = GGML_QUANT_SIZES[qtype][0] if qtype != T.BF16 else 32
    rng = np.random.default_rng(n_blocks)
    weights = (rng.standard_normal((n_blocks, bs)) * 0.05).astype(np.float32)
    raw = ref_quantize(weights, qtype).reshape(-1)
    ref = ref_dequantize(raw, qtype).reshape(-1)
    np.testing.assert_array_equal(native_f32(raw, qtype).view(np.uint32), ref.view(np.uint32))
    assert_bf16_matches(native_bf16(raw, qtype), ref)


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"], ids=["f32", "bf16"])
def test_wrapper_shape_dtype_values(qtype, dtype):
    """numpy out: float32 values, or bf16 as their uint16 bit patterns."""
    bs = GGML_QUANT_SIZES[qtype][0]
    rows, cols = 3, 2 * max(bs, 32)
    raw = random_blocks(qtype, rows * cols // bs, seed=int(qtype)).reshape(rows, -1)
    t = quant.dequantize(raw, qtype, (rows, cols), dtype=dtype)
    assert isinstance(t, np.ndarray) and t.shape == (rows, cols) and t.flags.c_contiguous
    assert t.dtype == (np.float32 if dtype == "float32" else np.uint16)
    ref = ref_dequantize(raw, qtype)
    assert ref.shape == (rows, cols)
    if dtype == "float32":
        np.testing.assert_array_equal(t.view(np.uint32), ref.view(np.uint32))
    else:
        assert_bf16_matches(t.reshape(-1), ref.reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_torch_wrapper_has_the_same_bits(dtype):
    """The torch reference's wrapper (lever.reference.linear.dequantize_tensor) and a
    torch dtype given to quant.dequantize (torch is imported here) give the same bits."""
    from lever.reference.linear import dequantize_tensor
    raw = random_blocks(T.Q4_K, 4, seed=3).reshape(2, -1)
    name = "float32" if dtype == torch.float32 else "bfloat16"
    bits = quant.dequantize(raw, T.Q4_K, (2, 512), dtype=name)
    t = dequantize_tensor(raw, T.Q4_K, (2, 512), dtype)
    assert t.dtype == dtype and t.shape == (2, 512)
    as_bits = t.numpy() if dtype == torch.float32 else t.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(as_bits, bits)
    np.testing.assert_array_equal(quant.dequantize(raw, T.Q4_K, (2, 512), dtype=dtype), bits)


def test_wrapper_accepts_bytes_read_only_and_non_contiguous_arrays():
    raw = random_blocks(T.Q4_K, 6, seed=1).reshape(6, -1)
    raw.flags.writeable = False  # like a GGUF file mapping
    ref = ref_dequantize(raw, T.Q4_K).reshape(-1)
    np.testing.assert_array_equal(native_f32(raw.reshape(-1), T.Q4_K).view(np.uint32), ref.view(np.uint32))
    from_bytes = quant.dequantize(raw.tobytes(), T.Q4_K, (6 * 256,))
    np.testing.assert_array_equal(from_bytes.view(np.uint32), ref.view(np.uint32))
    # every other block: a strided view that the wrapper must copy, not misread
    strided = quant.dequantize(raw[::2], T.Q4_K, (3, 256))
    expected = ref.reshape(6, 256)[::2]
    np.testing.assert_array_equal(strided.view(np.uint32), expected.view(np.uint32))


def test_empty_input():
    out = np.empty(0, np.float32)
    native.dequantize(np.empty(0, np.uint8), int(T.Q4_K), out)
    assert quant.dequantize(np.empty(0, np.uint8), T.Q6_K, (0, 256)).shape == (0, 256)


def test_fp16_scalar_cases(threads):
    """Every one of the 65536 fp16 bit patterns, as F16 data (NaN payloads included)."""
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint8)
    ref = ref_dequantize(raw, T.F16).reshape(-1)
    np.testing.assert_array_equal(native_f32(raw, T.F16).view(np.uint32), ref.view(np.uint32))
    assert_bf16_matches(native_bf16(raw, T.F16), ref)


def test_concurrent_calls_from_python_threads():
    """Several Python threads at once (the GIL is released; the pool is shared)."""
    native.set_num_threads(2)
    inputs = [(qt, random_blocks(qt, 1001, seed=i)) for i, qt in enumerate(SUPPORTED[2:])]
    expected = [ref_dequantize(raw, qt).reshape(-1) for qt, raw in inputs]
    results = [None] * len(inputs)
    errors = []

    def work(i):
        try:
            qt, raw = inputs[i]
            for _ in range(5):
                results[i] = native_f32(raw, qt)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    for got, ref in zip(results, expected):
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_pool_works_in_forked_child():
    native.set_num_threads(2)
    raw = random_blocks(T.Q4_K, 2001, seed=5)
    ref = ref_dequantize(raw, T.Q4_K).reshape(-1)
    native_f32(raw, T.Q4_K)  # the parent's pool has run a job
    pid = os.fork()
    if pid == 0:  # child: must not hang waiting for the parent's worker threads
        signal.alarm(int(deadline(60)))
        ok = np.array_equal(native_f32(raw, T.Q4_K).view(np.uint32), ref.view(np.uint32))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"


# --- API ------------------------------------------------------------------------

def test_supported_types_and_sizes():
    assert native.supported_types() == sorted(int(t) for t in SUPPORTED)
    assert quant.supported_types() == native.supported_types()
    for t in SUPPORTED:
        assert (native.block_size(int(t)), native.type_size(int(t))) == GGML_QUANT_SIZES[t]
        assert (quant.block_size(t), quant.type_size(t)) == GGML_QUANT_SIZES[t]
        assert quant.is_supported(t) and quant.is_supported(int(t))
    for t in (T.Q8_1, T.Q8_K, T.IQ2_XXS, T.IQ4_NL, T.TQ1_0, 4, 5, 99, -1):
        assert not quant.is_supported(t)


def test_set_num_threads():
    before = native.get_num_threads()
    try:
        native.set_num_threads(3)
        assert native.get_num_threads() == 3
        native.set_num_threads(1)
        assert native.get_num_threads() == 1
        native.set_num_threads(0)
        assert native.get_num_threads() == len(os.sched_getaffinity(0))
    finally:
        native.set_num_threads(before)


# --- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", [np.float32, np.uint16])
@pytest.mark.parametrize("delta", [-1, 1, -256, 32])
def test_wrong_out_size(out_dtype, delta):
    raw = random_blocks(T.Q4_K, 4, seed=0)
    out = np.empty(4 * 256 + delta, out_dtype)
    with pytest.raises(ValueError, match=r"output holds \d+ elements but 576 bytes of Q4_K encode 1024 elements"):
        native.dequantize(raw, int(T.Q4_K), out)


@pytest.mark.parametrize("qtype", [T.Q8_1, T.Q8_K, T.IQ2_XXS, T.TQ1_0, 4, 99, -1])
def test_unsupported_type(qtype):
    raw = np.zeros(256, np.uint8)
    with pytest.raises(ValueError, match=rf"ggml tensor type id {int(qtype)} is not supported"):
        native.dequantize(raw, int(qtype), np.empty(256, np.float32))
    with pytest.raises(ValueError, match="not supported"):
        native.block_size(int(qtype))
    with pytest.raises(ValueError, match="not supported"):
        native.type_size(int(qtype))
    name = T(qtype).name if qtype in set(T) else f"unknown type {int(qtype)}"
    with pytest.raises(UnsupportedModelError, match=name):
        quant.dequantize(raw, qtype, (256,))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q6_K, T.F16])
def test_truncated_raw(qtype):
    bs, ts = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, 8, seed=0)
    with pytest.raises(ValueError, match=f"not a whole number of {qtype.name} blocks"):
        native.dequantize(raw[:-1], int(qtype), np.empty(8 * bs, np.float32))
    with pytest.raises(ValueError, match=f"not a whole number of {qtype.name} blocks"):
        quant.dequantize(raw[:-1], qtype, (8 * bs,))
    # a whole block short: the element count no longer matches
    with pytest.raises(ValueError, match="encode"):
        native.dequantize(raw[:-ts], int(qtype), np.empty(8 * bs, np.float32))
    with pytest.raises(ValueError, match=r"shape \(8, \d+\) has \d+ elements but"):
        quant.dequantize(raw[:-ts], qtype, (8, bs))


def test_bad_buffers():
    raw = random_blocks(T.Q8_0, 4, seed=0)
    out = np.empty(128, np.float32)
    with pytest.raises(ValueError, match="raw must be C-contiguous"):
        native.dequantize(np.repeat(raw, 2)[::2], int(T.Q8_0), out)
    with pytest.raises(ValueError, match="raw must be a uint8 array"):
        native.dequantize(raw.view(np.int16), int(T.Q8_0), out)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        native.dequantize(raw, int(T.Q8_0), np.empty(256, np.float32)[::2])
    with pytest.raises(ValueError, match="out must be a float32 array, a float16 array or a uint16 array"):
        native.dequantize(raw, int(T.Q8_0), np.empty(128, np.float64))
    with pytest.raises(ValueError, match="out must be a float32 array, a float16 array or a uint16 array"):
        native.dequantize(raw, int(T.Q8_0), np.empty(128, np.int16))
    read_only = np.empty(128, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writable"):
        native.dequantize(raw, int(T.Q8_0), read_only)
    misaligned = np.empty(129 * 4 + 1, np.uint8)[1:].view(np.float32)
    with pytest.raises(ValueError, match="aligned"):
        native.dequantize(raw, int(T.Q8_0), misaligned[:128])
    for dtype in ("float16", torch.float16, np.float32):
        with pytest.raises(ValueError, match=r"unsupported compute dtype .*\(use float32 or bfloat16\)"):
            quant.dequantize(raw, T.Q8_0, (128,), dtype=dtype)


# --- real GGUF files --------------------------------------------------------------



def pick_tensors(path: str, types) -> dict:
    """Per type: (name, raw data, qtype) for the smallest tensor of that type
    and two 64-row slices (first rows, middle rows) of the largest one."""
    reader = gguf.GGUFReader(path)
    picked = {}
    for qtype in types:
        tensors = sorted((t for t in reader.tensors if t.tensor_type == qtype),
                         key=lambda t: int(t.n_elements))
        assert tensors, f"{path} has no {qtype.name} tensor"
        smallest, largest = tensors[0], tensors[-1]
        items = [(smallest.name, np.array(smallest.data))]
        rows = largest.data.shape[0]
        if largest.data.ndim > 1 and rows > 128:
            mid = rows // 2 + 1
            items.append((f"{largest.name}[:64]", np.array(largest.data[:64])))
            items.append((f"{largest.name}[{mid}:{mid + 64}]", np.array(largest.data[mid:mid + 64])))
        else:
            items.append((largest.name, np.array(largest.data)))
        picked[qtype] = items
    return picked


@pytest.fixture(scope="module")
def smollm2_tensors(smollm2_path):
    return pick_tensors(str(smollm2_path), [T.Q4_1, T.Q8_0, T.F32])


@pytest.fixture(scope="module")
def qwen05_tensors(qwen05_path):
    return pick_tensors(str(qwen05_path), [T.Q5_0, T.Q8_0, T.Q6_K, T.Q4_K, T.F32])


REAL = [("smollm2_tensors", T.Q4_1), ("smollm2_tensors", T.Q8_0), ("smollm2_tensors", T.F32),
        ("qwen05_tensors", T.Q5_0), ("qwen05_tensors", T.Q8_0), ("qwen05_tensors", T.Q6_K),
        ("qwen05_tensors", T.Q4_K), ("qwen05_tensors", T.F32)]


@pytest.mark.real
@pytest.mark.parametrize("fixture,qtype", REAL, ids=[f"{f.split('_')[0]}-{q.name}" for f, q in REAL])
def test_real_weights(request, fixture, qtype):
    native.set_num_threads(2)
    for name, data in request.getfixturevalue(fixture)[qtype]:
        ref = ref_dequantize(data, qtype)
        got = quant.dequantize(data, qtype, ref.shape, dtype="float32")
        assert got.shape == ref.shape, name
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=name)
        got16 = quant.dequantize(data, qtype, ref.shape, dtype="bfloat16")
        np.testing.assert_array_equal(got16, reference_bf16(ref), err_msg=name)
