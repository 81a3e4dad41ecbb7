"""Tiny random Hugging Face checkpoints of every family Lever targets, written
as GGUF the way users' files are made, and transformers' logits for them.

A recipe (RECIPES: family, variant) is a transformers config with the shape
features of the real family at toy size (2-4 layers, hidden size 256 so every
matrix row is a multiple of 256 and K-quants apply, vocabulary 512). The
weights are transformers' own seeded random init, then every norm weight and
bias moved by N(0, 0.2) so that norm offsets (Gemma's 1 + w) and biases count.

The vocabulary is a byte-level BPE made without training (tiny_tokenizer):
the 256 byte symbols, 252 merges of common character pairs, and
<pad>/<unk>/<bos>/<eos> (ids 508-511). convert_hf_to_gguf.py only recognises the pre-tokenizers
of published models (by hashing a tokenisation), so to_gguf runs it with that
check answering "gpt-2" -- which is what this vocabulary is: GPT-2's byte-level
pre-tokenizer; and where a converter first tries a SentencePiece vocabulary,
the missing tokenizer.model is the FileNotFoundError that sends it on to the
BPE one (as with the sentencepiece package installed), not an ImportError.
Everything else in the conversion is the sdist's unmodified code, with the
sdist's own gguf-py ahead of the installed gguf.

Everything built is cached under cache_root() ($LEVER_HF_TINY_DIR, else
$LEVER_CACHE_DIR/hf-tiny, else ~/.cache/lever/hf-tiny), one directory per
recipe named by a hash of the recipe, the seed, RECIPE_VERSION, the
transformers / torch versions and the llama.cpp sdist's, so a session builds each once and parallel
sessions never see a half-written file (built in a temp dir, renamed).

    make_checkpoint(family, variant="base", dir=None) -> Path
    to_gguf(checkpoint_dir, outtype) -> Path           (f32, bf16, q8_0, q4_k_m, q6_k)
    tensor_types(gguf_path) -> {tensor name: ggml type name}
    hf_logits(checkpoint_or_gguf, token_ids) -> float32 [T, vocab]
    teacher_forced_gaps(hf_logits, lever_tokens) -> [(position, lever_token, hf_argmax, gap)]

Which families transformers reads from a GGUF with their full architecture
is GGUF_FAITHFUL; for the others hf_logits(gguf) puts the GGUF's tensors,
dequantised by the `gguf` package through transformers' own GGUF tensor
mapping, into the checkpoint's architecture (see gguf_state_dict).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from lever.model.pretokenizers import byte_alphabet

ROOT = Path(__file__).resolve().parents[1]
RECIPE_VERSION = 2
SEED = 1234
VOCAB = 512
SPECIAL = ("<pad>", "<unk>", "<bos>", "<eos>")      # ids VOCAB-4 .. VOCAB-1
OUTTYPES_CONVERT = ("f32", "bf16", "q8_0")           # written by convert_hf_to_gguf.py
OUTTYPES_QUANTIZE = {"q4_k_m": "Q4_K_M", "q6_k": "Q6_K"}   # llama-quantize from the f32 GGUF
OUTTYPES = OUTTYPES_CONVERT + tuple(OUTTYPES_QUANTIZE)

_COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               rms_norm_eps=1e-5, initializer_range=0.05, pad_token_id=508, bos_token_id=510,
               eos_token_id=511)

# (family, variant) -> (architecture class, model_type, config keywords over _COMMON)
RECIPES: dict[tuple[str, str], tuple[str, str, dict]] = {
    # Llama 2 / 3 without scaling: GQA, untied head
    ("llama", "base"): ("LlamaForCausalLM", "llama",
                        dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Llama 3.1/3.2: llama3 RoPE scaling (llama.cpp writes it as the rope_freqs tensor). With
    # theta 1e4 and original context 64, head dims of wavelength 16..64 are smoothed and longer
    # ones divided by 8, so prompts of ~100 tokens see the difference.
    ("llama", "llama3"): ("LlamaForCausalLM", "llama",
                          dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 64},
                               tie_word_embeddings=True)),
    # Mistral (v0.3 / Nemo): no sliding window, head_dim 128 != hidden / heads (GGUF arch llama)
    ("mistral", "base"): ("MistralForCausalLM", "mistral",
                          dict(head_dim=128, sliding_window=None,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Qwen2 / 2.5: q/k/v biases, tied head
    ("qwen2", "base"): ("Qwen2ForCausalLM", "qwen2",
                        dict(tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Qwen3: q/k RMS norms per head, head_dim 128 != hidden / heads, tied head
    ("qwen3", "base"): ("Qwen3ForCausalLM", "qwen3",
                        dict(head_dim=128, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Gemma 3 text (270M-like): one KV head, head_dim 128 > hidden / heads, GELU-tanh, zero-centred
    # norms (1 + w), q/k norms, sandwich norms, sqrt(hidden) embedding scale, 5 sliding-window
    # layers (window 8) then a global one -- the pattern llama.cpp assumes for gemma3, whose GGUF
    # records only the window and the local RoPE base --, local / global RoPE bases, tied head.
    ("gemma3", "base"): ("Gemma3ForCausalLM", "gemma3_text",
                         dict(num_hidden_layers=6, num_key_value_heads=1, head_dim=128,
                              query_pre_attn_scalar=128, sliding_window=8,
                              layer_types=["sliding_attention"] * 5 + ["full_attention"],
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                               "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
                              tie_word_embeddings=True, rms_norm_eps=1e-6,
                              pad_token_id=508, bos_token_id=510, eos_token_id=511)),
    # Phi-4-mini: fused QKV and gate/up, partial rotary 0.75, tied head
    ("phi3", "base"): ("Phi3ForCausalLM", "phi3",
                       dict(tie_word_embeddings=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.75})),
    # Phi-3.5-mini / Phi-4-mini long context: LongRoPE (short factors up to the original context
    # of 32 tokens, long factors past it; attention factor from 512 / 32)
    ("phi3", "longrope"): ("Phi3ForCausalLM", "phi3",
                           dict(tie_word_embeddings=True, original_max_position_embeddings=32,
                                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.75,
                                                 "original_max_position_embeddings": 32,
                                                 "short_factor": [round(1.0 + 0.02 * i, 4) for i in range(24)],
                                                 "long_factor": [round(1.0 + 0.6 * i, 4) for i in range(24)]})),
    # SmolLM3: every 4th layer without RoPE (NoPE), tied head
    ("smollm3", "base"): ("SmolLM3ForCausalLM", "smollm3",
                          dict(num_hidden_layers=4, no_rope_layer_interval=4,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}
FAMILIES = tuple(dict.fromkeys(f for f, _ in RECIPES))

# Prompt lengths (tokens) the comparisons use: 24 is inside LongRoPE's original context (32, short
# factors), 100 past it (long factors) and past llama3's original 64; both cross gemma3's window of 8.
PROMPT_LENGTHS = (24, 100)

# The shape feature each recipe exists for, as config overrides that turn it off with the same
# weights (test_hf_tiny checks that the prompts above reach it: the logits change).
FEATURE_OFF: dict[tuple[str, str], tuple[str, dict]] = {
    ("llama", "llama3"): ("llama3 RoPE scaling", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    ("gemma3", "base"): ("the sliding window", dict(sliding_window=4096)),
    ("phi3", "base"): ("partial rotary", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 1.0})),
    ("phi3", "longrope"): ("LongRoPE", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 0.75})),
    ("smollm3", "base"): ("the NoPE layer", dict(no_rope_layers=[1, 1, 1, 1])),
    ("qwen2", "base"): ("the q/k/v biases", dict(attention_bias_zero=True)),
}


def prompt_ids(length: int, seed: int = 0) -> np.ndarray:
    """int64 [length] ids drawn uniformly from the non-special tokens (seeded)."""
    return np.random.default_rng(seed).integers(0, VOCAB - len(SPECIAL), length).astype(np.int64)

# The recipes whose GGUF transformers 5.x loads (`from_pretrained(dir, gguf_file=...)`) into the
# checkpoint's architecture (qwen3 only because its default head_dim, 128, is the recipe's: the
# GGUF's key_length is not read). Its GGUF reader loses llama3 scaling (rope_freqs is ignored),
# Phi-3's partial rotary factor and LongRoPE, Gemma 3's query_pre_attn_scalar (llama.cpp uses
# head_dim, transformers' default is 256), and has no smollm3; for those hf_logits takes the
# checkpoint's config.json and the GGUF's dequantised weights (load_hf's gguf_config).
GGUF_FAITHFUL = {("llama", "base"), ("mistral", "base"), ("qwen2", "base"), ("qwen3", "base")}


# ----------------------------------------------------------------- cache

def cache_root() -> Path:
    """Where built checkpoints live: $LEVER_HF_TINY_DIR, $LEVER_CACHE_DIR/hf-tiny or ~/.cache/lever/hf-tiny."""
    if os.environ.get("LEVER_HF_TINY_DIR"):
        return Path(os.environ["LEVER_HF_TINY_DIR"]).expanduser()
    base = os.environ.get("LEVER_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "lever") / "hf-tiny"


def recipe_key(family: str, variant: str) -> str:
    """A short hash of everything the checkpoint's bytes depend on."""
    import torch
    import transformers
    arch, model_type, kw = recipe(family, variant)
    blob = json.dumps({"v": RECIPE_VERSION, "seed": SEED, "common": _COMMON, "arch": arch, "type": model_type,
                       "kw": kw, "transformers": transformers.__version__, "torch": torch.__version__,
                       "vocab": _tokenizer_spec(), "llama.cpp": llamacpp_peer().sdist_version(),
                       "convert": _CONVERT_BOOT},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def recipe(family: str, variant: str) -> tuple[str, str, dict]:
    try:
        return RECIPES[(family, variant)]
    except KeyError:
        known = ", ".join(f"{f}/{v}" for f, v in RECIPES)
        raise ValueError(f"no tiny recipe {family}/{variant}; known: {known}") from None


def _publish(tmp: Path, dest: Path) -> None:
    """Rename the finished `tmp` to `dest`; another process that got there first wins."""
    try:
        os.rename(tmp, dest)
    except OSError:
        if not dest.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------- tokenizer

_MERGE_TEXT = ("the quick brown fox jumps over the lazy dog. def main(): return print(self, x) "
               "in for while if else import from class with as is not and or none true false ")


def _tokenizer_spec() -> dict:
    return {"n": VOCAB, "text": _MERGE_TEXT, "special": list(SPECIAL)}


def tiny_tokenizer(out_dir: Path) -> None:
    """Write tokenizer.json / tokenizer_config.json / special_tokens_map.json: a
    byte-level BPE of VOCAB tokens (256 bytes, VOCAB - 260 merges of the most
    frequent adjacent pairs of _MERGE_TEXT taken greedily, then SPECIAL)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = byte_alphabet()
    sym = [alphabet[b] for b in range(256)]
    vocab = {s: i for i, s in enumerate(sym)}
    merges: list[tuple[str, str]] = []
    split = _MERGE_TEXT.split(" ")
    words = [[sym[b] for b in w.encode()] for w in [split[0]] + [" " + w for w in split[1:] if w]]
    n_merges = VOCAB - 256 - len(SPECIAL)
    while len(merges) < n_merges:
        counts: dict[tuple[str, str], int] = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            # text exhausted: merge pairs of ascii letters in a fixed order
            for a in "etaoinshrdlucmfwypvbgkjqxz":
                for b in "etaoinshrdlucmfwypvbgkjqxz":
                    if (a, b) not in merges and a + b not in vocab and len(merges) < n_merges:
                        merges.append((a, b))
                        vocab[a + b] = len(vocab)
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    if len(vocab) != VOCAB - len(SPECIAL):
        raise AssertionError(f"tiny vocabulary has {len(vocab)} tokens, expected {VOCAB - len(SPECIAL)}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL))
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "model_max_length": 512}, indent=1))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, indent=1))


# ----------------------------------------------------------------- checkpoints

def build_config(family: str, variant: str = "base"):
    import transformers
    arch, model_type, kw = recipe(family, variant)
    cfg = transformers.AutoConfig.for_model(model_type, **{**_COMMON, **kw})
    cfg.architectures = [arch]
    return cfg


def make_checkpoint(family: str, variant: str = "base", dir: Path | str | None = None) -> Path:
    """The directory of the seeded random checkpoint of `family`/`variant`
    (config.json, model.safetensors in float32, the tiny tokenizer).  dir=None:
    the cached one under cache_root(), built on first use; else written to `dir`."""
    if dir is not None:
        out = Path(dir)
        out.mkdir(parents=True, exist_ok=True)
        _write_checkpoint(family, variant, out)
        return out
    dest = cache_root() / f"{family}-{variant}-{recipe_key(family, variant)}"
    if (dest / "model.safetensors").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    _write_checkpoint(family, variant, tmp)
    _publish(tmp, dest)
    return dest


def _write_checkpoint(family: str, variant: str, out: Path) -> None:
    import torch
    import transformers
    cfg = build_config(family, variant)
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(SEED + 1)
        for name, p in sorted(model.named_parameters()):
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(out, safe_serialization=True)
    tiny_tokenizer(out)
    (out / "tiny_recipe.json").write_text(json.dumps({"family": family, "variant": variant,
                                                       "recipe": recipe(family, variant)}, indent=1))


def checkpoint_recipe(checkpoint_dir: Path) -> tuple[str, str]:
    """(family, variant) a checkpoint directory was made from."""
    rec = json.loads((Path(checkpoint_dir) / "tiny_recipe.json").read_text())
    return rec["family"], rec["variant"]


# ----------------------------------------------------------------- GGUF

def llamacpp_peer():
    """bench/llamacpp_peer.py as a module (bench/ is not a package)."""
    name = "llamacpp_peer"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "llamacpp_peer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# Run convert_hf_to_gguf.py unchanged but for the two vocabulary look-ups (see the module docstring).
_CONVERT_BOOT = r"""
import runpy, sys
script = sys.argv[1]
sys.argv = [script] + sys.argv[2:]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
spm = base.TextModel._create_vocab_sentencepiece
def no_spm(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return spm(self)
base.TextModel._create_vocab_sentencepiece = no_spm
runpy.run_path(script, run_name="__main__")
"""


def gguf_path(checkpoint_dir: Path, outtype: str) -> Path:
    family, variant = checkpoint_recipe(checkpoint_dir)
    return Path(checkpoint_dir) / "gguf" / f"tiny-{family}-{variant}-{outtype}.gguf"


def to_gguf(checkpoint_dir: Path | str, outtype: str = "f32") -> Path:
    """The GGUF of a tiny checkpoint, written on first use into checkpoint_dir/gguf/.

    f32, bf16, q8_0: convert_hf_to_gguf.py --outtype (the sdist's script and
    gguf-py).  q4_k_m, q6_k: llama-quantize of the f32 GGUF (the built
    binary; pytest.skip when it is absent).  Its tensor types are in
    `<file>.types.json` (tensor_types)."""
    checkpoint_dir = Path(checkpoint_dir)
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    out = gguf_path(checkpoint_dir, outtype)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    peer = llamacpp_peer()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        if outtype in OUTTYPES_CONVERT:
            src = peer.llama_source_dir()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "gguf-py"), str(src)]),
                   "NO_LOCAL_GGUF": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            cmd = [sys.executable, "-c", _CONVERT_BOOT, str(src / "convert_hf_to_gguf.py"), str(checkpoint_dir),
                   "--outfile", str(tmp), "--outtype", outtype,
                   # general.name: by default the folder's name; llama.cpp gives a vocabulary whose
                   # model name contains "phi3" Phi-3's special tokens (</s>, <s>, ...), which this
                   # vocabulary lacks, so the name is neutral
                   "--model-name", f"hf-tiny {checkpoint_dir.name.rsplit('-', 1)[-1]}"]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if r.returncode or not tmp.is_file():
                raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {r.returncode}) for {checkpoint_dir}:\n"
                                   f"{r.stderr[-3000:]}")
        else:
            binary = peer.binary("llama-quantize")
            if binary is None:
                import pytest
                pytest.skip(f"llama-quantize is not built ({peer.BUILD_HINT})")
            peer.quantize(binary, to_gguf(checkpoint_dir, "f32"), tmp, OUTTYPES_QUANTIZE[outtype])
        types = _read_types(tmp)
        Path(f"{out}.types.json").write_text(json.dumps(types, indent=1))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _read_types(path: Path) -> dict[str, str]:
    import gguf
    reader = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in reader.tensors}


def tensor_types(path: Path | str) -> dict[str, str]:
    """{tensor name: ggml type name} of a GGUF (from its sidecar when to_gguf wrote one)."""
    side = Path(f"{path}.types.json")
    return json.loads(side.read_text()) if side.is_file() else _read_types(Path(path))


# ----------------------------------------------------------------- transformers

def _checkpoint_of(gguf_file: Path) -> Path:
    """The checkpoint directory a to_gguf file lives in (checkpoint/gguf/<file>)."""
    d = Path(gguf_file).resolve().parent.parent
    if not (d / "config.json").is_file():
        raise ValueError(f"{gguf_file}: not inside a tiny checkpoint's gguf/ folder")
    return d


# llama.cpp's converter permutes the q/k rows of these architectures (LlamaModel.permute);
# transformers' LlamaTensorProcessor undoes it
_PERMUTED = {"llama", "smollm3"}


def gguf_state_dict(model, gguf_file: Path) -> dict:
    """The GGUF's tensors dequantised by the `gguf` package, renamed to `model`'s
    parameter names and un-permuted by transformers' own GGUF machinery (the
    GGUF's architecture's tensor name map and tensor processor, e.g. Gemma's
    norm - 1) -- what `from_pretrained(gguf_file=...)` does, but for any
    architecture gguf-py names (smollm3 too) and into `model`'s config."""
    import gguf
    import torch
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, LlamaTensorProcessor,
                                                          TensorProcessor, get_gguf_hf_weights_map)
    reader = gguf.GGUFReader(str(gguf_file))
    arch = reader.fields["general.architecture"].contents()
    cfg = model.config
    heads = {"num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads}
    processor = (LlamaTensorProcessor if arch in _PERMUTED else TENSOR_PROCESSORS.get(arch, TensorProcessor))(heads)
    names = get_gguf_hf_weights_map(model, processor, model_type=arch, num_layers=cfg.num_hidden_layers)
    out = {}
    for t in reader.tensors:
        r = processor.process(weights=gguf.dequantize(t.data, t.tensor_type), name=t.name,
                              tensor_key_mapping=names, parsed_parameters={"config": heads})
        if r.name in names:                   # rope_freqs / rope_factors_*: not parameters
            out[names[r.name]] = torch.from_numpy(np.array(r.weights, dtype=np.float32))   # a writable copy
    return out


def load_hf(path: Path | str, *, gguf_config: str = "auto"):
    """A transformers model (float32, eager attention, eval) for a checkpoint
    directory or a to_gguf file.  For a GGUF, gguf_config "gguf" takes the
    architecture from the GGUF (`from_pretrained(dir, gguf_file=name)`),
    "checkpoint" from the checkpoint's config.json with the GGUF's dequantised
    weights (gguf_state_dict), "auto" the first for GGUF_FAITHFUL families."""
    import torch
    import transformers
    path = Path(path)
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    if path.is_dir():
        return transformers.AutoModelForCausalLM.from_pretrained(path, **kw).eval()
    ckpt = _checkpoint_of(path)
    if gguf_config == "auto":
        gguf_config = "gguf" if checkpoint_recipe(ckpt) in GGUF_FAITHFUL else "checkpoint"
    if gguf_config == "gguf":
        return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kw).eval()
    if gguf_config != "checkpoint":
        raise ValueError(f"gguf_config must be auto, gguf or checkpoint, got {gguf_config!r}")
    cfg = transformers.AutoConfig.from_pretrained(ckpt)
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    state = gguf_state_dict(model, path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"{path}: GGUF tensors do not fill the model: missing {sorted(set(missing) - tied)}, "
                           f"unexpected {sorted(unexpected)}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def load_hf_without_feature(checkpoint_dir: Path | str):
    """The checkpoint with its recipe's FEATURE_OFF overrides applied (same weights)."""
    import torch
    import transformers
    what, overrides = FEATURE_OFF[checkpoint_recipe(checkpoint_dir)]
    overrides = dict(overrides)
    zero_bias = overrides.pop("attention_bias_zero", False)
    cfg = transformers.AutoConfig.from_pretrained(checkpoint_dir)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint_dir, config=cfg, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    if zero_bias:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
    return model


def hf_logits(path_or_model, token_ids, *, gguf_config: str = "auto") -> np.ndarray:
    """transformers' logits, float32 [T, vocab], for token_ids (one sequence,
    positions 0..T-1, no BOS added) on a checkpoint directory, a to_gguf
    file (see load_hf) or an already loaded model."""
    import torch
    model = path_or_model if hasattr(path_or_model, "forward") else load_hf(path_or_model, gguf_config=gguf_config)
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))[None]
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits[0].float().numpy()


def teacher_forced_gaps(hf_logits: np.ndarray, lever_tokens) -> list[tuple[int, int, int, float]]:
    """Where a greedy run's tokens leave the reference's argmax, fed the same prefix.

    hf_logits: float32 [T, vocab], the reference's logits for prompt +
    lever_tokens[:-1] (row i predicts the token after position i); pass the
    rows that predict lever_tokens, i.e. hf_logits[len(prompt) - 1:].
    lever_tokens: the greedy tokens to check, one per row.  Returns, for each
    row whose argmax differs, (row, lever_token, hf_argmax, gap) with gap =
    the reference's max logit minus its logit for lever_token (>= 0, in
    logit units): a small gap is a near-tie, a large one a real divergence."""
    logits = np.asarray(hf_logits, dtype=np.float64)
    tokens = list(lever_tokens)
    if logits.ndim != 2 or logits.shape[0] != len(tokens):
        raise ValueError(f"need one logits row per token: logits {logits.shape}, {len(tokens)} tokens")
    out = []
    for i, tok in enumerate(tokens):
        best = int(logits[i].argmax())
        if tok != best:
            out.append((i, int(tok), best, float(logits[i, best] - logits[i, tok])))
    return out
