"""llama.cpp as a reference peer: greedy continuations, tokenisation and
quantisation through the binaries bench/bench_llamacpp.py builds
(`python bench/bench_llamacpp.py --build`: llama-completion, llama-tokenize,
llama-quantize, ... under $LEVER_LLAMACPP_DIR/build/bin, default
~/.cache/lever/llamacpp).  Plain functions over subprocesses; importable by
path from the tests (bench/ is not a package).

Exact token ids.  llama-completion prints text, not ids, and re-tokenising
its text is not exact (a BPE merges across the boundary of two generated
pieces differently).  So greedy_continuation runs it with a prompt cache
(`--prompt-cache FILE --prompt-cache-all`): at exit llama.cpp saves every
token it evaluated -- the prompt as it tokenised it, then each generated id
-- as int32s at the head of that file (magic "ggsn", version, count, ids),
which read_session_tokens reads back.  The prompt part is checked against
what was asked for, so a prompt given as ids that does not survive the trip
through text (llama-completion takes text only) is an error, never a silent
mismatch.  Decoding is greedy (--temp 0 --top-k 1, no repetition penalty,
no chat template: -no-cnv) and stops after n_tokens or at an end-of-generation
token (which is then the last id returned).
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lever.model.pretokenizers import byte_alphabet

_HERE = Path(__file__).resolve().parent
SESSION_MAGIC = 0x6767736E          # "ggsn" (LLAMA_FILE_MAGIC_GGSN)
BUILD_HINT = "build them with: python bench/bench_llamacpp.py --build"


class PeerError(RuntimeError):
    """A llama.cpp tool failed or gave output that cannot be trusted (one line plus its stderr tail)."""


def _bench():
    """bench/bench_llamacpp.py (the build, the sdist's location)."""
    if "bench_llamacpp" in sys.modules:
        return sys.modules["bench_llamacpp"]
    spec = importlib.util.spec_from_file_location("bench_llamacpp", _HERE / "bench_llamacpp.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_llamacpp"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["bench_llamacpp"]
        raise
    return module


def cache_dir() -> Path:
    """$LEVER_LLAMACPP_DIR, else ~/.cache/lever/llamacpp (the sdist and build/)."""
    return _bench().DEFAULT_CACHE


def sdist_version() -> str:
    """The llama-cpp-python source distribution whose llama.cpp is built and converts ("0.3.36")."""
    return _bench().SDIST_VERSION


def binary(name: str, cache: Path | None = None) -> Path | None:
    """The built llama.cpp tool `name` (e.g. "llama-completion"), None when absent."""
    path = Path(cache or cache_dir()) / "build" / "bin" / name
    return path if os.access(path, os.X_OK) else None


def llama_source_dir(cache: Path | None = None) -> Path:
    """The sdist's vendor/llama.cpp (convert_hf_to_gguf.py, gguf-py, models/),
    downloaded and unpacked when absent."""
    return _bench().llama_source(Path(cache or cache_dir()))


def _run(cmd: list[str], what: str, timeout_s: float, stdin_text: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, input=stdin_text, stdin=None if stdin_text is not None else subprocess.DEVNULL,
                       capture_output=True, text=True, errors="replace", timeout=timeout_s)
    if r.returncode:
        tail = "\n".join(r.stderr.strip().splitlines()[-15:])
        raise PeerError(f"{what} failed (exit {r.returncode}): {' '.join(cmd[:3])} ...\n{tail}")
    return r


# ----------------------------------------------------------------- tokenize

def tokenize(bin: Path | str, gguf: Path | str, text: str, bos: bool = True, timeout_s: float = 120) -> list[int]:
    """llama.cpp's token ids for `text` (exact bytes: read from stdin, no escape
    processing; special tokens written in the text are parsed, as
    llama-completion does).  bos: add the BOS token when the vocabulary asks
    for one (False: never).  bin: the llama-tokenize binary."""
    cmd = [str(bin), "-m", str(gguf), "--stdin", "--no-escape", "--ids"]          # logs: stderr
    if not bos:
        cmd.append("--no-bos")
    r = _run(cmd, "llama-tokenize", timeout_s, stdin_text=text)
    return parse_ids(r.stdout)


def parse_ids(stdout: str) -> list[int]:
    """The ids of `llama-tokenize --ids` output: its one line `[1, 2, 3]`."""
    lines = [ln for ln in stdout.splitlines() if re.fullmatch(r"\s*\[[-\d,\s]*\]\s*", ln)]
    if len(lines) != 1:
        raise PeerError(f"llama-tokenize printed no single id list: {stdout[-300:]!r}")
    body = lines[0].strip()[1:-1].strip()
    return [int(x) for x in body.split(",")] if body else []


# ----------------------------------------------------------------- greedy decoding

@dataclass(frozen=True)
class Continuation:
    """One greedy run: the prompt ids llama.cpp evaluated, the ids it generated,
    and what it printed (stdout: the generated text, then llama.cpp's own lines)."""

    prompt_ids: list[int]
    generated: list[int]
    stdout: str
    stderr: str


def read_session_tokens(path: Path | str) -> list[int]:
    """The token ids at the head of a llama.cpp session / prompt-cache file."""
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            raise PeerError(f"{path}: a session file of {len(head)} bytes")
        magic, _version, n = struct.unpack("<III", head)
        if magic != SESSION_MAGIC:
            raise PeerError(f"{path}: not a llama.cpp session file (magic {magic:#x})")
        raw = f.read(4 * n)
    if len(raw) != 4 * n:
        raise PeerError(f"{path}: session file holds {len(raw) // 4} of its {n} token ids")
    return list(struct.unpack(f"<{n}i", raw))


def completion(bin: Path | str, gguf: Path | str, prompt: str | Sequence[int], n_tokens: int, threads: int = 1,
               *, context: int | None = None, tokenize_bin: Path | str | None = None,
               extra: Sequence[str] = (), timeout_s: float = 600) -> Continuation:
    """Greedy decoding of up to n_tokens after `prompt` with llama-completion
    (`bin`), raw (no chat template).  prompt: text (tokenised by llama.cpp,
    with BOS if the vocabulary adds one: llama-tokenize, found next to `bin`
    or given as tokenize_bin, says which ids to expect) or the exact ids to
    evaluate (BOS included if wanted), turned into text with the GGUF's
    vocabulary (detokenize).  Either way the ids llama-completion evaluated
    must equal the expected ones, else PeerError.  context: KV size in tokens
    (default: prompt + n_tokens + 8, rounded up to 256).  threads: -t and -tb."""
    bin = Path(bin)
    if isinstance(prompt, str):
        text = prompt
        want = tokenize(tokenize_bin or bin.with_name("llama-tokenize"), gguf, text)
    else:
        want = [int(t) for t in prompt]
        text = detokenize(gguf, want)
    if context is None:
        context = -(-(len(want) + n_tokens + 8) // 256) * 256
    with tempfile.TemporaryDirectory(prefix="lever-peer-") as tmp:
        session = Path(tmp) / "session.bin"
        cmd = [str(bin), "-m", str(gguf), "-p", text, "--no-escape", "-n", str(n_tokens), "-c", str(context),
               "-t", str(threads), "-tb", str(threads), "-s", "0", "--temp", "0", "--top-k", "1",
               "--repeat-penalty", "1.0", "-no-cnv", "--no-warmup", "--no-display-prompt",
               "--prompt-cache", str(session), "--prompt-cache-all", *extra]
        r = _run(cmd, "llama-completion", timeout_s)
        if not session.is_file():
            raise PeerError(f"llama-completion wrote no prompt cache {session}:\n{r.stderr[-2000:]}")
        ids = read_session_tokens(session)
    if ids[:len(want)] != want:
        how = "llama-tokenize's ids" if isinstance(prompt, str) else \
            "the prompt ids (they do not survive llama-completion's text input: pass the prompt as text)"
        raise PeerError(f"llama-completion evaluated {ids[:len(want) + 2][:16]}... for a prompt of "
                        f"{len(want)} ids, not {how}: {want[:16]}...")
    return Continuation(want, ids[len(want):], r.stdout, r.stderr)


def greedy_continuation(bin: Path | str, gguf: Path | str, prompt: str | Sequence[int], n_tokens: int,
                        threads: int = 1, **kw) -> list[int]:
    """The ids llama.cpp generates greedily after `prompt` (see completion):
    n_tokens of them, fewer when it stops at an end-of-generation id (the last
    one returned)."""
    return completion(bin, gguf, prompt, n_tokens, threads, **kw).generated


# ----------------------------------------------------------------- ids -> text

def detokenize(gguf: Path | str, ids: Sequence[int]) -> str:
    """The text whose llama.cpp tokenisation should be `ids` (minus a leading
    BOS that the vocabulary adds by itself): each token's bytes from the
    GGUF's vocabulary (gpt2: byte-level symbols; llama / SentencePiece: "▁" is
    a space and <0xXX> a byte), control tokens as their text (llama.cpp
    parses them back).  A SentencePiece vocabulary that adds a space prefix
    loses one leading space.  The round trip is checked by completion."""
    import gguf as gg
    reader = gg.GGUFReader(str(gguf))

    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    model = field("tokenizer.ggml.model")
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type") or [1] * len(tokens)
    bos = field("tokenizer.ggml.bos_token_id")
    ids = list(ids)
    if ids and bos is not None and ids[0] == bos and field("tokenizer.ggml.add_bos_token", model == "llama"):
        ids = ids[1:]
    table = {c: b for b, c in byte_alphabet().items()}       # printable stand-in -> byte
    out = bytearray()
    for i in ids:
        tok, kind = tokens[i], types[i]
        if kind in (3, 4):                       # CONTROL, USER_DEFINED: written as is
            out += tok.encode()
        elif model == "gpt2":
            out += bytes(table[c] for c in tok)
        elif kind == 6 and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", tok):   # BYTE
            out.append(int(tok[3:5], 16))
        else:
            out += tok.replace("\u2581", " ").encode()
    text = out.decode("utf-8", errors="surrogateescape")
    if model == "llama" and field("tokenizer.ggml.add_space_prefix", True) and text.startswith(" "):
        text = text[1:]
    return text


# ----------------------------------------------------------------- quantize

def quantize(bin: Path | str, src: Path | str, dst: Path | str, type: str, threads: int | None = None,
             *, allow_requantize: bool = False, timeout_s: float = 1800) -> Path:
    """llama-quantize `src` into `dst` as `type` (e.g. "Q4_K_M", "Q6_K", "Q8_0"):
    llama.cpp picks each tensor's type (norms stay F32; rows that are not a
    multiple of a K-quant's 256 get its fallback type).  Returns dst."""
    cmd = [str(bin)] + (["--allow-requantize"] if allow_requantize else []) + [str(src), str(dst), type]
    if threads:
        cmd.append(str(threads))
    _run(cmd, "llama-quantize", timeout_s)
    if not Path(dst).is_file():
        raise PeerError(f"llama-quantize exited 0 but wrote no {dst}")
    return Path(dst)
