"""Smoke test of an installed lever wheel, run by .ci/aarch64_wheel.sh under
qemu-user with an arm64 CPython (works natively too). Needs numpy and gguf,
plus tests/ on sys.path for the tiny model writer; no torch.

1. lever._native imports and names the machine's kernels.
2. Dequantisation equals gguf's numpy reference bit for bit (quantised with
   gguf for the 32-blocks, random blocks for the K-quants).
3. quant_matmul, for every matmul type and every instruction set the CPU has:
   close to float64 numpy (quantised activations x dequantised weights), and
   a row's result is bit-identical alone or inside a batch.
4. Speculative greedy decoding of tiny quantised models (chain, tree) gives the
   target-only token ids (the exactness bar): Q8_0, Q4_1, Q5_0 (quantised by
   gguf) and Q4_K, Q6_K (random blocks: gguf cannot quantise K-quants).

Prints one line per check; exits 1 on the first failure."""

from __future__ import annotations

import contextlib
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize as ref_dequantize
from gguf.quants import quantize as ref_quantize

from lever import _native, quant

QUANTISED_BY_GGUF = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16]
K_QUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
# byte offsets of the fp16 scale fields of a K-quant block (the rest may be any bytes)
K_SCALE_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
# byte offsets of the fp16 scale fields of the matmul types' blocks
MATMUL_SCALE_FIELDS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 14: (208,)}


def say(msg: str) -> None:
    print(f"[smoke] {msg}", flush=True)


def random_blocks(qtype: int, n_blocks: int, scale_fields, rng) -> np.ndarray:
    """n_blocks random blocks of qtype as flat uint8, with small finite fp16 scales."""
    ts = GGML_QUANT_SIZES[T(qtype)][1]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in scale_fields:
        scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def check_dequantize(rng) -> None:
    for qtype in QUANTISED_BY_GGUF:
        bs = GGML_QUANT_SIZES[qtype][0]
        x = rng.standard_normal((3, 7 * max(bs, 32))).astype(np.float32)
        raw = ref_quantize(x, qtype)
        got = quant.dequantize(raw, int(qtype), x.shape)
        want = ref_dequantize(raw, qtype).astype(np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=qtype.name)
    for qtype in K_QUANTS:
        raw = random_blocks(int(qtype), 9, K_SCALE_FIELDS[qtype], rng)
        got = quant.dequantize(raw, int(qtype), (9 * 256,))
        want = ref_dequantize(raw.reshape(9, -1), qtype).reshape(-1).astype(np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=qtype.name)
    say(f"dequantize bit-exact against gguf: {len(QUANTISED_BY_GGUF) + len(K_QUANTS)} types")


def quantize_activations(x: np.ndarray, block: int) -> np.ndarray:
    """x after the kernels' activation quantisation (d = amax/127, round half away from 0)."""
    xb = x.reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
    v = (xb * inv).astype(np.float32)
    q = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
    return (q * (amax / np.float32(127.0)).astype(np.float32)).reshape(x.shape)


def check_quant_matmul(rng) -> int:
    checked = 0
    for qtype in _native.matmul_types():
        if qtype not in MATMUL_SCALE_FIELDS:
            continue
        bs = quant.block_size(qtype)
        rows, cols = 37, (2 * bs if bs == 256 else 9 * bs)
        raw = random_blocks(qtype, rows * cols // bs, MATMUL_SCALE_FIELDS[qtype], rng)
        w = quant.dequantize(raw, qtype, (rows, cols)).astype(np.float64)
        x = rng.standard_normal((19, cols)).astype(np.float32)
        xq = quantize_activations(x, 256 if bs == 256 else 32).astype(np.float64)
        want, scale = xq @ w.T, np.abs(xq) @ np.abs(w).T + 1e-30
        for isa in _native.available_isas():
            out = np.empty((x.shape[0], rows), np.float32)
            _native.quant_matmul(x, raw, qtype, out, isa)
            err = (np.abs(out - want) / scale).max()
            assert err < 1e-3, f"{quant.type_name(qtype)} {isa}: error {err:.2e} of sum|w||x|"
            for i in (0, 7, 18):
                one = np.empty((1, rows), np.float32)
                _native.quant_matmul(np.ascontiguousarray(x[i:i + 1]), raw, qtype, one, isa)
                np.testing.assert_array_equal(one[0], out[i], err_msg=f"{quant.type_name(qtype)} {isa} row {i}")
            checked += 1
    say(f"quant_matmul against numpy and batch-independent: {checked} (type, isa) pairs")
    return checked


@contextlib.contextmanager
def random_k_quant_blocks(seed: int):
    """Within the block, gguf.quants.quantize of a K-quant type (which gguf
    cannot quantise) returns random blocks of that type with small finite
    scales, so tiny_model.write_tiny_gguf can write Q4_K / Q6_K models."""
    import gguf.quants
    original, rng = gguf.quants.quantize, np.random.default_rng(seed)

    def quantize(x, qtype):
        if qtype not in K_SCALE_FIELDS:
            return original(x, qtype)
        rows, cols = x.shape
        return random_blocks(int(qtype), rows * cols // 256, K_SCALE_FIELDS[qtype], rng).reshape(rows, -1)

    gguf.quants.quantize = quantize
    try:
        yield
    finally:
        gguf.quants.quantize = original


def check_speculative_exactness(directory: Path) -> int:
    from tiny_model import write_tiny_gguf

    from lever.autoregressive import generate_tokens
    from lever.draft.base import TreeShape
    from lever.draft.model_drafter import ModelDrafter
    from lever.engine import SpecConfig, speculative_generate
    from lever.model.native_loader import load_gguf_native

    sizes = dict(arch="llama", tied=False, std=0.2, vocab=211, hidden=64, ff=128, heads=8, kv_heads=2, context=512)
    prompts = [[5, 17, 99, 3], [7, 7, 150, 33, 2, 90, 11, 64]]
    specs = {"chain": SpecConfig("chain", draft_len=3), "tree": SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4))}
    # K-quant models: hidden and ff multiples of 256, random blocks drawn afresh
    # from the same seed for target and draft, so the draft is the target and
    # whole tree paths are accepted (the 32-block drafts are noisy copies: some are)
    k_sizes = dict(sizes, hidden=256, ff=512)
    runs = accepted = 0
    for matrix_type in ("Q8_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"):
        kw = k_sizes if matrix_type.endswith("_K") else sizes
        with random_k_quant_blocks(seed=21):
            target_path = write_tiny_gguf(directory / f"target-{matrix_type}.gguf", seed=10, matrix_type=matrix_type, **kw)
        with random_k_quant_blocks(seed=21):
            draft_path = write_tiny_gguf(directory / f"draft-{matrix_type}.gguf", seed=10, matrix_type=matrix_type,
                                         noise=0.3, noise_seed=11, **kw)
        target = load_gguf_native(target_path, "float32")[0]
        draft = load_gguf_native(draft_path, "float32")[0]
        for prompt in prompts:
            ref = generate_tokens(target, prompt, 24).token_ids
            for mode, spec in specs.items():
                got, stats = speculative_generate(target, ModelDrafter(draft), prompt, 24, spec=spec)
                assert got.token_ids == ref, f"{matrix_type} {mode} prompt {prompt}: {got.token_ids} != {ref}"
                runs += 1
                accepted += stats.accepted
    say(f"speculative greedy == target-only greedy: {runs} runs (Q8_0, Q4_1, Q5_0, Q4_K, Q6_K tiny models; "
        f"chain, tree), {accepted} draft tokens accepted")
    return runs


def main() -> int:
    start = time.monotonic()
    say(f"machine {platform.machine()}, python {platform.python_version()}, lever._native {_native.__file__}")
    say(f"kernel isa {_native.kernel_isa()}, available {_native.available_isas()}")
    rng = np.random.default_rng(15)
    check_dequantize(rng)
    check_quant_matmul(rng)
    with tempfile.TemporaryDirectory() as d:
        check_speculative_exactness(Path(d))
    say(f"all checks passed in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
