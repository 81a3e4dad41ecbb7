"""A real GGUF against two independent implementations: greedy tokens
teacher-forced against transformers, and compared with llama.cpp.

For each prompt (raw text, no chat template):
- the prompt's ids are llama.cpp's (`llama-tokenize`), and Lever's tokenizer
  must give the same ids;
- Lever (native decoder, weights as stored, bf16 KV cache as `lever generate`)
  decodes --tokens tokens greedily; n-gram speculation (chain and tree) must
  give exactly those tokens;
- transformers loads the same GGUF (weights dequantised by the `gguf`
  package, float32, eager attention) and scores prompt + Lever's tokens in
  one forward: at every position Lever's token must be transformers' argmax,
  or within --tie-gap logits of it (a near-tie; the gap is printed);
- llama.cpp (`llama-completion`, greedy) continues the same prompt: its
  tokens must equal Lever's up to the first divergence, where transformers'
  gap between the two tokens shows whether it is a near-tie.

Prints one line per prompt and writes JSON:

    python bench/families_check.py --model gemma-3-270m [--prompts 10] [--tokens 64]
        [--threads 2] [--tie-gap 0.5] [--out bench/results]

Why a gap bound at all: Lever and llama.cpp both multiply quantised weights
with activations quantised to 8 bits, each in its own way, and transformers
multiplies the dequantised weights in float32; their logits differ by up to
about 1-2 (of a logit range of tens) on Q4_K_M files, so where two tokens are
that close, any of the three may pick either.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_peer as peer  # noqa: E402
from lever.autoregressive import generate_tokens  # noqa: E402
from lever.draft.base import TreeShape  # noqa: E402
from lever.draft.ngram import NgramDrafter  # noqa: E402
from lever.engine import SpecConfig, speculative_generate  # noqa: E402
from lever.gguf.registry import resolve_model  # noqa: E402
from lever.model.native_loader import load_gguf_native  # noqa: E402
from lever.model.tokenizer import Tokenizer  # noqa: E402

PROMPTS = [
    "The three primary colors are",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The capital of France is Paris. The capital of Germany is",
    "Photosynthesis is the process by which plants",
    "To make a cup of tea, first",
    "1, 2, 3, 5, 8, 13, 21,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In 1969, the Apollo 11 mission",
    "Water boils at 100 degrees Celsius at sea level, but on a high mountain",
]
SPECS = {"ngram-chain4": SpecConfig("chain", draft_len=4),
         "ngram-tree16": SpecConfig("tree", tree=TreeShape(budget=16, topk=4, depth=6))}


def teacher_forced(hf, ids: list[int], n_prompt: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' argmax and gap (its logit of its argmax minus its logit of
    the token actually there) at each generated position of ids."""
    import torch
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float().numpy()
    rows = logits[n_prompt - 1:len(ids) - 1]
    tokens = np.array(ids[n_prompt:])
    best = rows.argmax(axis=1)
    gap = rows[np.arange(len(tokens)), best] - rows[np.arange(len(tokens)), tokens]
    return best, gap


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--prompts", type=int, default=len(PROMPTS))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tie-gap", type=float, default=0.5, help="logits: a divergence within this gap is a near-tie")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    import torch
    import transformers

    path = Path(args.model) if args.model.endswith(".gguf") else Path(resolve_model(args.model))
    completion, tokenize = peer.binary("llama-completion"), peer.binary("llama-tokenize")
    if completion is None or tokenize is None:
        raise SystemExit(f"llama.cpp binaries missing: {peer.BUILD_HINT}")
    model, g = load_gguf_native(path, "bfloat16")
    tok = Tokenizer.from_gguf(g)
    t0 = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    print(f"transformers loaded {path.name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    results, ok = [], True
    for i, text in enumerate(PROMPTS[:args.prompts]):
        ids = peer.tokenize(tokenize, path, text)
        same_ids = tok.encode(text) == ids
        ours = generate_tokens(model, ids, args.tokens).token_ids
        spec_equal = {name: speculative_generate(model, NgramDrafter(), ids, args.tokens, spec=spec)[0].token_ids
                      == ours for name, spec in SPECS.items()}
        best, gap = teacher_forced(hf, ids + ours, len(ids))
        off = [(j, int(ours[j]), int(best[j]), float(gap[j])) for j in range(len(ours)) if best[j] != ours[j]]
        theirs = peer.greedy_continuation(completion, path, ids, args.tokens, threads=args.threads)
        n = min(len(ours), len(theirs))
        split = next((j for j in range(n) if ours[j] != theirs[j]), None)
        split_gap = None
        if split is not None:
            _, g2 = teacher_forced(hf, ids + ours[:split] + [theirs[split]], len(ids))
            split_gap = float(g2[-1] - gap[split])   # transformers: logit(lever's) - logit(llama.cpp's)
        row = dict(prompt=text, prompt_ids=len(ids), lever_tokenizer_equal=same_ids, lever=ours,
                   llamacpp=theirs, ngram_exact=spec_equal, hf_not_argmax=off,
                   max_gap=max((o[3] for o in off), default=0.0), llamacpp_split=split,
                   llamacpp_split_hf_gap=split_gap)
        good = same_ids and all(spec_equal.values()) and row["max_gap"] <= args.tie_gap and \
            (split is None or abs(split_gap) <= args.tie_gap)
        ok &= good
        results.append(row)
        print(f"prompt {i}: {len(ours)} tokens; tokenizer {'=' if same_ids else '!='} llama.cpp; "
              f"n-gram {'exact' if all(spec_equal.values()) else 'DIFFERS'}; "
              f"transformers argmax {len(ours) - len(off)}/{len(ours)} (max gap {row['max_gap']:.3f}); "
              f"llama.cpp " + ("identical" if split is None else
                               f"parts at token {split} (transformers gap {split_gap:+.3f})")
              + ("" if good else "  <-- FAIL"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / f"families_check-{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    dest.write_text(json.dumps({"model": str(path), "tie_gap": args.tie_gap, "threads": args.threads,
                                "host": os.uname().nodename, "results": results}, indent=1))
    print(f"{'all' if ok else 'NOT all'} {len(results)} prompts within a gap of {args.tie_gap}; wrote {dest}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
