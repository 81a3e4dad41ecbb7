"""`smollm3`: Llama's block (q / k rows interleaved by llama.cpp's converter,
as for `llama`), with every fourth layer attending without RoPE (NoPE:
layers 3, 7, 11, ...; llama.cpp's `n_no_rope_layer_step` = 4, which its GGUF
files do not record)."""

from .base import Family, Meta, rope_scaling_fields

NO_ROPE_EVERY = 4


def describe(meta: Meta) -> dict:
    n = meta.int("block_count")
    kinds = "".join("n" if (i + 1) % NO_ROPE_EVERY == 0 else "g" for i in range(n))
    return {"layer_kinds": kinds, **rope_scaling_fields(meta, ("linear",))}


FAMILY = Family("smollm3", "smollm3", describe, permutes_qk=True)
