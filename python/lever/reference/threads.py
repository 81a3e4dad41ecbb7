"""How many threads torch's own ops get while a forward pass runs.

With native kernels doing the matrix work, torch only runs small per-row ops
(norms, RoPE, activations), which gain nothing from threads; but torch's
OpenMP workers keep spinning after each op and take the second core away
from the native thread pool.  Measured on 2 cores: the 0.5B / 1.5B models
decode 9-10% faster and a 64-token tree pass ~1.7x faster with torch on one
thread.  Models whose matrices are quantised therefore run their forward
with one torch thread; dense models keep torch's setting.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int | None):
    """Run the block with `n` torch intra-op threads (None: leave torch's setting)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
