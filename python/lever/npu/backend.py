"""Putting a decoder's layers on a static-shape backend: the one entry point.

    layers = use_static_backend(decoder, "qnn", BucketSet((1, 8, 16, 32), (128, 256, 512)))

After it, `decoder` (a `NativeDecoder` or `StreamedDecoder`) embeds tokens,
applies the final norm and runs the head on the native CPU core as before,
and runs every decoder layer through the bucket graphs of `backend`
(lever.npu.layers.StaticLayers).  Its `config.max_context` drops to the
largest context bucket.  The draft model and every decision (tree growth,
acceptance, cache compaction) stay on the CPU.
"""

from __future__ import annotations

from .. import _native
from .buckets import BucketSet
from .context import BucketGraphs
from .graph import unsupported
from .layers import StaticLayers
from .runtime import NpuError, QnnTarget, check_backend


def use_static_backend(decoder, backend: str, buckets: BucketSet, target: QnnTarget | None = None,
                       threads: int | None = None, root=None, keep_weights: bool = False) -> StaticLayers:
    """Run `decoder`'s layers on `backend` ("cpu-static" or "qnn") over `buckets`;
    returns the layer runner (its `report()` goes into stats JSON).  target:
    the SoC for qnn (default SoC 57).  threads: onnxruntime's intra-op
    threads (default: the native core's).  root: the context cache's parent
    directory (default ``$LEVER_CACHE_DIR/npu``).  keep_weights: keep every
    layer's dequantised weights after its first pass (DRAM no memory plan
    counts: tests and small models only).  NpuError (one line) naming a block
    feature of the model the bucket graphs cannot compute."""
    check_backend(backend)
    problem = unsupported(decoder.config)
    if problem:
        raise NpuError(f"--backend {backend}: {problem} is not supported")
    graphs = BucketGraphs(decoder.config, backend, threads or _native.get_num_threads(), target, root)
    layers = StaticLayers(decoder.config, graphs, buckets.planner, keep_weights=keep_weights)
    decoder.run_layers_on(layers, max_context=buckets.planner.max_context)
    return layers
