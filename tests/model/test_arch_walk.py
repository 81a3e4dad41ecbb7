"""The architecture x backend walk: every family `lever.arch.FAMILIES` registers
(a tiny GGUF of it, tests/arch_gguf.py, plus the llama3 and LongRoPE
variants) on every backend that runs a target's layers -- the native
decoder, the torch reference (`load_model(..., kernels="torch")`) and the
static-shape graph on ONNX Runtime's CPU EP.

Each combination either runs -- finite logits that agree with the native
decoder's within the float32 bound of the native-vs-reference and
static-vs-native tests, over a prompt longer than gemma3's sliding window,
token-by-token decoding and a tree pass -- or refuses in one line: a
LeverError of one line naming the feature, listed in REFUSED.  Anything else
(another exception, a traceback, an unlisted refusal, a wrong answer) fails.
Each variant's file must also turn on the block features it is there for
(FEATURES), so a GGUF the family reads differently cannot pass as a plain one."""

from __future__ import annotations

import numpy as np
import pytest

from arch_gguf import WINDOW, write_arch_gguf
from lever.arch import FAMILIES
from lever.errors import LeverError
from lever.model.loading import load_model
from lever.model.native_loader import load_gguf_native
from lever.npu.backend import use_static_backend
from lever.npu.buckets import BucketSet
from test_block_features import PROMPT, rel_err, run
from test_block_features import REL as REFERENCE_TOL      # reference vs native on float32 weights
from test_npu_exact import EXACT_CPU_TOL                   # static graph (CPU EP) vs native on float32 weights

# variant -> (family, write_arch_gguf keywords)
VARIANTS = {
    "llama": ("llama", {}),
    "llama3": ("llama", {"rope_freqs": True}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3", {}),
    "phi3": ("phi3", {}),
    "phi3-longrope": ("phi3", {"longrope": True}),
    "smollm3": ("smollm3", {}),
}
# variant -> the ModelConfig fields its file must set (what the variant is there to exercise)
FEATURES = {
    "llama": {"layer_kinds": "", "rope_freq_factors": ()},
    "llama3": {"rope_scaling": "llama3"},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True, "head_dim": 32},
    "gemma3": {"qk_norm": True, "sandwich_norms": True, "activation": "gelu_tanh", "layer_kinds": "lllllg",
               "sliding_window": WINDOW, "rope_theta_local": 10000.0, "rope_linear": 2.0, "logit_softcap": 3.0,
               "embed_scale": 8.0, "tie_word_embeddings": True},
    "phi3": {"rope_dims": 12, "tie_word_embeddings": True},
    "phi3-longrope": {"rope_scaling": "longrope", "rope_dims": 12, "max_context": 128},
    "smollm3": {"layer_kinds": "gggn"},
}
BACKENDS = ("native", "reference", "static")
# (variant, backend) -> words the one-line refusal must hold; none today: every combination runs
REFUSED: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    return {v: write_arch_gguf(d / f"{v}.gguf", fam, seed=7, **kw) for v, (fam, kw) in VARIANTS.items()}


def test_every_registered_family_is_walked():
    assert {fam for fam, _ in VARIANTS.values()} == set(FAMILIES)
    assert set(FEATURES) == set(VARIANTS) and len(PROMPT) > WINDOW


def load(path, backend: str):
    if backend == "reference":
        return load_model(path, "float32", kernels="torch")[0]
    model = load_gguf_native(path, "float32")[0]
    if backend == "static":
        use_static_backend(model, "cpu-static", BucketSet((1, 4, 8), (16, 32)))
    return model


def outcome(path, backend: str):
    """The logits of `run` on `backend`, or the LeverError it refused with
    (one line); any other exception propagates and fails the test."""
    try:
        return run(load(path, backend))
    except LeverError as e:
        assert len(str(e).splitlines()) == 1, f"a refusal of more than one line: {e}"
        return e


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_file_turns_its_features_on(files, variant):
    cfg = load_gguf_native(files[variant], "float32")[0].config
    assert cfg.arch == VARIANTS[variant][0]
    for field, want in FEATURES[variant].items():
        assert getattr(cfg, field) == want, f"{variant}: {field} is {getattr(cfg, field)!r}, expected {want!r}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_architecture_on_every_backend(files, variant, backend):
    native = outcome(files[variant], "native")
    got = native if backend == "native" else outcome(files[variant], backend)
    if isinstance(got, LeverError):
        words = REFUSED.get((variant, backend))
        assert words is not None, f"{variant} on {backend} refused: {got}"
        assert words in str(got), f"{variant} on {backend}: the refusal does not name {words!r}: {got}"
        return
    assert (variant, backend) not in REFUSED, f"{variant} on {backend} ran; REFUSED says it cannot"
    assert not isinstance(native, LeverError), f"{variant} runs on {backend} but the native decoder refused: {native}"
    assert np.all(np.isfinite(got)), f"{variant} on {backend}: non-finite logits"
    if backend != "native":
        err = rel_err(got, native)
        bound = REFERENCE_TOL if backend == "reference" else EXACT_CPU_TOL
        print(f"{variant} {backend}: {err:.2e} of the largest logit")
        assert err <= bound, f"{variant} on {backend}: {err:.2e} of the largest logit from native (> {bound})"
