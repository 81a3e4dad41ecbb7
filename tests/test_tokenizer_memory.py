"""What a tokenizer costs in resident memory: `import lever`, then a GGUF's
tokenizer loaded from the tokenizer cache, measured as the process's peak
(VmHWM, lever.memory.rss) in a fresh interpreter.

Measured (tokenizers 0.23, numpy 2.4, gguf 0.19): `import lever` 12 MB;
SmolLM2-135M (49,152 tokens) 68 MB; Qwen2.5-Coder (151,936 tokens) 129 MB, of
which the imports (numpy, gguf, tokenizers) are ~41 MB, the GGUF metadata as
Python lists ~31 MB, the cache key ~12 MB and the Rust BPE model ~45 MB. The
bars below sit ~10% above those numbers, so a regression (an eager import of
torch/aiohttp/transformers, the cache going back to a whole tokenizer.json:
+131 MB instead of +55 MB for Qwen) fails.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MB = 1_000_000

MEASURE = """
import json, sys
import lever
from lever.memory.rss import read_status
after_import = read_status()["VmHWM"]
from lever.model.gguf_file import GGUFFile
from lever.model.tokenizer import Tokenizer
tok = Tokenizer.from_gguf(GGUFFile(sys.argv[1]), cache_dir=sys.argv[2])
assert tok.encode("def fib(n): return n")
print(json.dumps({"import": after_import, "peak": read_status()["VmHWM"],
                  "heavy": sorted(m for m in ("torch", "aiohttp", "transformers", "matplotlib", "tqdm", "jinja2")
                                  if m in sys.modules)}))
"""


def measure(gguf, cache_dir) -> dict:
    """Peak RSS (bytes) after `import lever` and after the tokenizer, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", MEASURE, str(gguf), str(cache_dir)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.real
@pytest.mark.parametrize("model, bar_mb", [("smollm2_path", 75), ("qwen05_path", 142)])
def test_tokenizer_memory(model, bar_mb, request, tmp_path):
    gguf = request.getfixturevalue(model)
    measure(gguf, tmp_path)                    # builds and caches the tokenizer
    m = measure(gguf, tmp_path)                # the usual case: a cache hit
    assert m["import"] <= 20 * MB, m
    assert m["peak"] <= bar_mb * MB, f"{m['peak'] / MB:.1f} MB > {bar_mb} MB"
    assert m["heavy"] == [], m


def test_api_import_is_light():
    """`import lever.api` pulls in no server, plotting, progress-bar, GGUF or torch packages
    (the GGUF machinery is imported when a model is looked up or loaded)."""
    code = ("import sys, lever.api\nfrom lever.memory.rss import read_status\n"
            "print([m for m in ('torch', 'aiohttp', 'transformers', 'matplotlib', 'tqdm', 'gguf') if m in sys.modules],"
            " read_status()['VmHWM'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("]")
    assert out[0] + "]" == "[]"
    assert int(out[1]) <= 45 * MB
