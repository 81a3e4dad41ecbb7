"""llama.cpp's source tree, from the llama-cpp-python source distribution
(its vendor/llama.cpp): what bench/bench_llamacpp.py builds, and where the
tokenizer tests find llama.cpp's vocab goldens (models/ggml-vocab-*.gguf
with their .inp / .out files).

`llama_source(cache)` downloads the sdist with pip into `cache` when it is
absent (`pip download --no-deps --no-binary llama-cpp-python`) and unpacks
it; both go through temporary names renamed into place, so two processes
fetching at once each see either nothing or a whole tree.  A download that
fails raises `SourceUnavailable`, whose `offline` says whether the failure
was the network (no index reachable, or an index that has no version of the
package at all): the tests skip on that and fail on anything else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lever.errors import LeverError

SDIST_VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{SDIST_VERSION}"
DEFAULT_CACHE = Path(os.environ.get("LEVER_LLAMACPP_DIR") or Path.home() / ".cache" / "lever" / "llamacpp")

# What pip prints when no index can be reached (or none lists the package at all).
OFFLINE_SIGNS = ("from versions: none", "NewConnectionError", "Failed to establish a new connection",
                 "Temporary failure in name resolution", "Name or service not known", "Network is unreachable",
                 "connection error", "ConnectTimeoutError", "ReadTimeoutError", "ProxyError")


class SourceUnavailable(LeverError):
    """pip could not download the sdist; `offline`: because of the network."""

    def __init__(self, message: str, offline: bool):
        super().__init__(message)
        self.offline = offline


def llama_source(cache: Path) -> Path:
    """vendor/llama.cpp of the sdist in `cache`, downloading and unpacking it when absent."""
    src = cache / SDIST / "vendor" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"{SDIST}.tar.gz"
    if not archive.is_file():
        download(archive)
    print(f"unpacking {archive}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{SDIST}.") as tmp:
        with tarfile.open(archive) as tar:
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, **extra)
        try:
            os.rename(Path(tmp) / SDIST, cache / SDIST)
        except OSError as e:
            if not (src / "CMakeLists.txt").is_file():     # not another process that got there first
                raise LeverError(f"cannot unpack into {cache / SDIST} ({e.strerror}): "
                                 f"a partial tree from an interrupted unpack? remove it") from None
    if not (src / "CMakeLists.txt").is_file():
        raise LeverError(f"{archive}: has no vendor/llama.cpp/CMakeLists.txt")
    return src


def download(archive: Path) -> None:
    """The sdist, fetched by pip into a temporary directory beside `archive` and renamed to it."""
    print(f"downloading llama-cpp-python=={SDIST_VERSION} (source) into {archive.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=archive.parent, prefix=f".{SDIST}.download.") as tmp:
        out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                              f"llama-cpp-python=={SDIST_VERSION}", "-d", tmp], capture_output=True, text=True)
        got = Path(tmp) / archive.name
        if out.returncode or not got.is_file():
            text = out.stdout + out.stderr
            last = next((x for x in reversed(text.splitlines()) if x.strip()), f"exit status {out.returncode}")
            raise SourceUnavailable(f"pip could not download llama-cpp-python=={SDIST_VERSION}: {last.strip()}",
                                    offline=any(s in text for s in OFFLINE_SIGNS))
        os.replace(got, archive)

