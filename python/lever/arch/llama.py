"""`llama`: Llama 2, Llama 3.x (llama3 RoPE scaling from the rope_freqs
tensor), Mistral-style files and the many fine-tunes sharing the layout.
llama.cpp's converter interleaves each q / k head's rows for its RoPE; the
loaders undo it (`permutes_qk`)."""

from .base import Family, Meta, rope_scaling_fields


def describe(meta: Meta) -> dict:
    return rope_scaling_fields(meta, ("linear", "llama3"))


FAMILY = Family("llama", "llama", describe, permutes_qk=True)
