"""Load a decoder from a Hugging Face checkpoint directory (`config.json` +
`*.safetensors`): the model types whose block `config_from_hf` describes
(`HF_MODEL_TYPES`); any other is refused in one line (its GGUF file runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from ..errors import ModelFormatError, UnsupportedModelError
from ..model_config import ModelConfig, checked_config
from .decoder import Decoder
from .weights import build_decoder, parse_dtype


# Hugging Face model_type -> the ModelConfig fields its block sets beyond Llama's
HF_MODEL_TYPES = {"llama": {}, "qwen2": {"attention_bias": True}, "qwen3": {"qk_norm": True}}


def config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    """The block description of a transformers config.json (a dict);
    UnsupportedModelError for a model type or a feature it does not describe."""
    arch = hf.get("model_type")
    if arch not in HF_MODEL_TYPES:
        raise UnsupportedModelError(f"{source}: Hugging Face checkpoints of model_type {arch!r} are not supported "
                                    f"(supported: {', '.join(HF_MODEL_TYPES)}; its GGUF file may run)")
    if hf.get("use_sliding_window"):
        raise UnsupportedModelError(f"{source}: use_sliding_window is not supported for {arch} checkpoints")
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type")) or rope.get("rope_type", "default")
    if rope_type not in ("default", None):
        raise UnsupportedModelError(f"{source}: RoPE scaling {rope_type!r} is not supported")
    try:
        hidden, n_heads = _int(hf["hidden_size"]), _int(hf["num_attention_heads"])
        values = dict(
            arch=arch,
            vocab_size=_int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=_int(hf["intermediate_size"]),
            n_layers=_int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=_int(hf.get("num_key_value_heads") or n_heads),
            head_dim=_int(hf.get("head_dim") or (hidden // n_heads if n_heads > 0 else 0)),
            rms_norm_eps=_float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=_float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
            max_context=_int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
        )
        values.update(HF_MODEL_TYPES[arch])
    except KeyError as e:
        raise ModelFormatError(f"{source}: key {e.args[0]!r} is missing") from None
    except (TypeError, ValueError, OverflowError) as e:
        raise ModelFormatError(f"{source}: a hyperparameter is not a number ({e})") from None
    return checked_config(values, source, ModelFormatError)


def _int(value) -> int:
    """A JSON integer (floats with a fraction, strings and bools refused)."""
    if type(value) is bool or (type(value) is float and not value.is_integer()):
        raise ValueError(f"{value!r} is not an integer")
    return int(value)


def _float(value) -> float:
    if type(value) not in (int, float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def checkpoint_tensors(directory: Path, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{directory}: no *.safetensors files")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                name = key[len("model."):] if key.startswith("model.") else key
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    continue
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                yield name, st.get_tensor(key)


def load_checkpoint_model(directory, dtype: str | torch.dtype = torch.bfloat16) -> Decoder:
    """A torch Decoder computing in `dtype` from a checkpoint directory."""
    dtype = parse_dtype(dtype)
    d = Path(directory)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ModelFormatError(f"{d}: config.json is missing (not a Hugging Face checkpoint directory)")
    try:
        hf = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ModelFormatError(f"{cfg_path}: not valid JSON ({e})") from None
    cfg = config_from_hf(hf, str(cfg_path))
    return build_decoder(cfg, checkpoint_tensors(d, cfg), dtype, source=str(d))
