"""The cost model of speculative decoding on this device (README, "Design").

`lever.cost.profile` measures a target / draft pair on the device (`lever
profile`) and caches the result per (model, store, backend, machine);
`lever.cost.cost_model.CostModel` turns that profile into predicted seconds
per target pass over n tree tokens, per draft forward over f nodes, and per
iteration of host work.  `lever.cost.npu_profile` builds the profile from a
device's measured per-bucket layer times instead (`--npu-profile FILE`).
"""
