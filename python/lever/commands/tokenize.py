"""`lever tokenize`: the token ids of a text under a model's tokenizer.

Only the tokenizer is read (the GGUF's header metadata, through the
tokenizer cache): a vocab-only GGUF, without tensors or hyperparameters,
will do.  The ids print on one line, separated by spaces (the format of
llama.cpp's vocab goldens, ggml-vocab-*.gguf.out); `--json` prints one JSON
object instead: `ids` and `tokens` (each id's vocabulary string).

By default the text is encoded as a prompt is: BOS (and EOS) as the model's
file says, special-token text such as ``<|im_start|>`` parsed as the special
token.  `--no-bos` encodes the text alone: no BOS or EOS, and special-token
text as plain text (llama.cpp's `add_special = false, parse_special =
false`, what its goldens hold).
"""

from __future__ import annotations

import argparse
import json

from ..config import DEFAULT_MODEL
from ..errors import PromptError
from . import arg_types
from .options import add_cache_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tokenize", help="print the token ids of a text under a model's tokenizer",
        description="Print the token ids of --text under the model's tokenizer, on one line separated by "
                    "spaces (--json: a JSON object with the ids and their tokens). Reads only the "
                    "tokenizer: a vocab-only GGUF will do.")
    p.add_argument("--model", type=arg_types.name, default=DEFAULT_MODEL,
                   help=f"registered model name (see `lever models`), GGUF file (a vocab-only one will do) or "
                        f"checkpoint dir whose tokenizer is used (default: {DEFAULT_MODEL})")
    p.add_argument("--text", required=True, metavar="TEXT", help="the text to tokenize")
    p.add_argument("--no-bos", action="store_true",
                   help="no BOS or EOS, and special-token text as plain text (as llama.cpp's vocab goldens); "
                        "default: BOS/EOS as the model says, special tokens parsed")
    p.add_argument("--json", action="store_true", help='print {"ids": [...], "tokens": [...]} instead')
    add_cache_dir(p)
    p.set_defaults(run=run)


def token_ids(tokenizer, text: str, special: bool) -> list[int]:
    """The ids of `text`: with `special`, BOS/EOS as the model says and
    special tokens parsed; without, neither."""
    if special:
        return tokenizer.encode(text)
    return tokenizer.encode(text, add_bos=False, add_eos=False, parse_special=False)


def run(args: argparse.Namespace) -> int:
    from ..gguf.registry import resolve_model
    from ..model.tokenizer_match import model_tokenizer
    from ..values import cache_root

    try:
        args.text.encode("utf-8")
    except UnicodeEncodeError as e:       # argv bytes that are not UTF-8 arrive as surrogates
        raise PromptError(f"--text is not UTF-8 text (character {e.start})") from None
    path = resolve_model(args.model, cache_dir=cache_root(args.cache_dir))
    tokenizer = model_tokenizer(path, args.cache_dir)
    ids = token_ids(tokenizer, args.text, special=not args.no_bos)
    if args.json:
        print(json.dumps({"ids": ids, "tokens": [tokenizer.id_to_token(i) for i in ids]}))
    else:
        print(" ".join(str(i) for i in ids))
    return 0
