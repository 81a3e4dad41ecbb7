"""Static-shape execution of the target's decoder layers: ONNX Runtime's CPU
execution provider (``cpu-static``) or Qualcomm's QNN HTP (``qnn``, the
phone's NPU; simulated on an x86-64 host).

- `buckets`: the compiled (rows, context) bucket sets and the native planner
  that packs a tree into one (csrc/graph/bucket_planner).
- `graph`: one decoder layer as a static-shape ONNX graph, weights as inputs.
- `runtime`: onnxruntime sessions, the QNN execution provider, SoC targets.
- `context`: bucket sessions and the cache of QNN context binaries.
- `layers`: the layer runner a `NativeDecoder` uses on these backends.
- `backend`: `use_static_backend(decoder, ...)`, the one entry point.

A device's measured per-bucket layer times (`--npu-profile FILE`) are read
into the cost model by lever.cost.npu_profile.
"""
