"""Export a GGUF model to a Hugging Face directory (config, tokenizer,
safetensors) that a serving engine such as vLLM loads, so that the engine
serves the very weights lever drafts or verifies with (quantised tensors are
dequantised to `dtype`).

    python -m lever.remote.hf_export MODEL OUT_DIR [--dtype float32]

MODEL is a registered name (e.g. qwen2.5-coder-0.5b) or a .gguf path.  Needs
torch and transformers (EXPORT_INSTALL): a tool, never imported on the run path.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..atomic_write import write_atomic
from ..errors import LeverError
from ..extras import DIST, EXTRA_PACKAGES, pip_command
from ..gguf.registry import resolve_model

DTYPES = ("float32", "bfloat16", "float16")
EXPORT_INSTALL = (pip_command(EXTRA_PACKAGES["torch"] + ("transformers>=4.56", "accelerate>=1.0"))
                  + f" (all in {DIST}'s test extra)")
MARKER = "lever_export.json"          # what was exported, from which file


def export_hf(model: str, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write the Hugging Face directory of `model` (a name or a .gguf path) to
    out_dir; reuse it when a previous export of the same file and dtype is there."""
    if dtype not in DTYPES:
        raise LeverError(f"--dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise LeverError(f"exporting to a Hugging Face directory needs torch and transformers "
                         f"({EXPORT_INSTALL}): {e}") from None
    gguf = Path(model) if model.endswith(".gguf") else Path(resolve_model(model))
    if not gguf.is_file():
        raise LeverError(f"{gguf}: no such GGUF file")
    out = Path(out_dir)
    stamp = {"gguf": str(gguf.resolve()), "bytes": gguf.stat().st_size, "dtype": dtype}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                              dtype=getattr(torch, dtype))
    hf.hf_quantizer = None                   # the tensors are dequantised already: save them plainly
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    hf.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_atomic(marker, json.dumps(stamp))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lever.remote.hf_export", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a registered model name or a .gguf path")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    args = p.parse_args(argv)
    print(export_hf(args.model, args.out_dir, args.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
