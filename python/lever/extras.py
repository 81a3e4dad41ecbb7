"""What each optional extra installs, and the pip commands Lever prints for them.

The distribution `lever-llm` is not on the package index, so a hint that asks
pip for the extra `lever-llm[plot]` fails for everyone who installed Lever
from a checkout.  Every hint therefore names the packages themselves, which
install the same way however Lever got there, and the extra they make up:
`install_hint("plot")` is "pip install 'matplotlib>=3.5' (lever-llm's plot
extra)".  EXTRA_PACKAGES repeats pyproject.toml's optional dependencies
(tests/cli/test_dist_name.py checks that they agree).
"""

from __future__ import annotations

import re
from typing import Iterable

DIST = "lever-llm"

# extra -> its requirements, as in pyproject.toml's [project.optional-dependencies]
EXTRA_PACKAGES: dict[str, tuple[str, ...]] = {
    "server": ("aiohttp>=3.9",),
    "plot": ("matplotlib>=3.5",),
    "torch": ("torch==2.13.0", "safetensors>=0.4"),
    "npu": ("onnxruntime>=1.24.2", "onnxruntime-qnn==2.7.0", "onnx>=1.16"),
}

_PLAIN = re.compile(r"[A-Za-z0-9._=-]+")       # needs no quoting in a POSIX shell


def pip_command(requirements: Iterable[str], no_deps: bool = False) -> str:
    """`pip install [--no-deps] REQ ...`, each requirement single-quoted when the
    shell would otherwise read it (e.g. `>=`)."""
    reqs = [r if _PLAIN.fullmatch(r) else f"'{r}'" for r in requirements]
    return " ".join(["pip install", *(["--no-deps"] if no_deps else []), *reqs])


def install_hint(extra: str) -> str:
    """The pip command for `extra`'s packages, naming the extra:
    "pip install 'aiohttp>=3.9' (lever-llm's server extra)"."""
    return f"{pip_command(EXTRA_PACKAGES[extra])} ({DIST}'s {extra} extra)"
