"""What runs a target's layers, as the device profile records it: the native
decoder, or a static-shape backend (lever.npu) -- its layer runner, its
name, whether its NPU is simulated on this host, and what its timings
depend on (part of a profile's key)."""

from __future__ import annotations

import platform

from ..npu.runtime import versions


ARM_MACHINES = ("aarch64", "arm64", "armv8l", "armv7l")


def static_layers(target):
    """The static-shape layer runner of `target` (lever.npu.layers.StaticLayers, set
    by lever.npu.backend.use_static_backend), or None on the native backend."""
    layers = getattr(target, "layers", None)
    return layers if getattr(layers, "fixed_shapes", False) else None


def target_backend(target) -> str:
    """What runs `target`'s layers: "native", "cpu-static" or "qnn"."""
    layers = static_layers(target)
    return str(layers.backend) if layers is not None else "native"


def simulated_npu(target) -> bool:
    """Whether `target`'s layers run on a simulated NPU: qnn's HTP on a host that
    is not ARM (onnxruntime-qnn's x86-64 simulator); its timings are not an NPU's."""
    return simulated_backend(target_backend(target))


def simulated_backend(backend: str) -> bool:
    """Whether `backend` runs on a simulated NPU on this host (qnn off ARM)."""
    return backend == "qnn" and platform.machine().lower() not in ARM_MACHINES


def static_identity(layers) -> dict:
    """What a static backend's timings depend on: the backend, its row and context
    buckets, the graphs' dtype and threads, the SoC (qnn) and the onnxruntime /
    QNN versions; and whether the NPU is simulated."""
    graphs = layers.graphs
    target = getattr(graphs, "target", None)
    return {"layers": str(layers.backend), "rows": [int(r) for r in layers.planner.rows],
            "contexts": [int(c) for c in layers.planner.contexts], "graph_dtype": str(layers.dtype),
            "threads": int(getattr(graphs, "threads", 0) or 0),
            "soc_model": getattr(target, "soc_model", None), "htp_arch": getattr(target, "htp_arch", None),
            "versions": versions(), "simulated": simulated_backend(str(layers.backend))}
