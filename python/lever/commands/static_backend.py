"""`--backend cpu-static|qnn` on generate, bench and profile: the checks made
before anything loads, and the lines and JSON that report it (the backend
itself is part of the run configuration, lever.config.BackendConfig, and
lever.runtime.build puts the target's layers on it).  The options themselves are defined once
in commands.options.add_backend_options.

On a static-shape backend the CPU keeps every decision and the draft, and
the target's decoder layers run bucket by bucket through ONNX Runtime
(lever.npu).  So drafting ahead -- the draft extends the tree while the
target verifies it -- is the default in modes with a draft model there
(`--no-draft-ahead` turns it off), and probes (rows pruned mid-pass) are
refused: a compiled bucket cannot drop rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


def is_static(args) -> bool:
    return args.backend != "native"


@dataclass(frozen=True)
class BackendChecks:
    """What `check_backend_args` resolved: probes, the --probes value to use
    (auto is off on a static backend; None when the command has no --probes);
    npu_profile: the --npu-profile file read (lever.npu.npu_profile.NpuProfile), or None."""

    probes: str | None
    npu_profile: object = None


def check_backend_args(args, *, kernels: str = "native", remote=None, probes: str | None = None,
                       command: str = "") -> BackendChecks:
    """Refuse what a static backend cannot run (one line each), before anything
    loads; check onnxruntime (and onnxruntime-qnn) are installed and read the
    --npu-profile file.  `args` is only read; the resolved values are returned."""
    backend = args.backend
    if args.soc is not None and backend != "qnn":
        raise UsageError(f"--soc chooses the SoC of --backend qnn; this run's backend is {backend}")
    if backend != "native":
        if kernels == "torch":
            raise UsageError(f"--backend {backend} runs the native decoder's layers on static-shape graphs; "
                             f"--kernels torch is the torch reference (use --kernels native)")
        if remote:
            raise UsageError(f"--backend {backend} runs the target in this process; with --remote the server "
                             f"verifies (choose one)")
        if probes == "on":
            raise UsageError(f"--probes on prunes tree rows mid-pass, which --backend {backend} cannot: a "
                             f"compiled bucket has fixed rows (use --probes off)")
        if probes is not None:
            probes = "off"
        check_installed(backend)
    npu_profile = None
    if args.npu_profile:
        if remote:
            raise UsageError("--npu-profile sizes the trees of a target in this process; with --remote the "
                             "server verifies (choose one)")
        from ..cost.npu_profile import load_npu_profile
        npu_profile = load_npu_profile(args.npu_profile)
    return BackendChecks(probes, npu_profile)


def check_installed(backend: str) -> None:
    """NpuError (one line, with the pip command) unless `backend`'s packages are installed."""
    import importlib.util

    from ..npu.runtime import INSTALL_HINT, NpuError, onnxruntime
    onnxruntime()
    if backend == "qnn" and importlib.util.find_spec("onnxruntime_qnn") is None:
        raise NpuError(f"--backend qnn needs the onnxruntime-qnn package, which is not installed ({INSTALL_HINT})")


def bucket_set(args):
    """The --buckets x --contexts BucketSet."""
    from ..npu.buckets import BucketSet
    return BucketSet.parse(args.buckets, args.contexts)


def qnn_target(args):
    """The QnnTarget of --soc (default SoC) for qnn, else None (lever.runtime.qnn_target)."""
    from ..runtime import qnn_target as target_of
    return target_of(args.backend, args.soc)


def context_root(args):
    """Where context binaries are cached (lever.runtime.npu_root of --cache-dir)."""
    from ..runtime import npu_root
    return npu_root(args.cache_dir)


def draft_ahead_default(args, draft: str | None) -> bool:
    """Whether to draft ahead when the command line does not say: on a static
    backend with a draft model (the draft runs on the CPU while the target's
    layers run on the NPU), unless --no-draft-ahead."""
    if args.no_draft_ahead:
        return False
    return is_static(args) and bool(draft) and draft != "ngram"


def backend_json(args, layers) -> dict:
    """The run's backend for stats JSON: its name, and on a static backend the
    layer runner's report (bucket runs, split passes, padded rows, ...), the
    buckets, the SoC and whether the NPU is simulated."""
    if layers is None:
        return {"backend": "native"}
    from ..cost.backend import simulated_backend
    out = {**layers.report(), "rows_buckets": [int(r) for r in layers.planner.rows],
           "context_buckets": [int(c) for c in layers.planner.contexts]}
    target = getattr(layers.graphs, "target", None)
    if target is not None:
        out.update(soc_model=target.soc_model, htp_arch=target.htp_arch, simulated=simulated_backend(layers.backend))
    rows = out.get("rows", 0) + out.get("padded_rows", 0)
    out["padded_share"] = round(out.get("padded_rows", 0) / rows, 4) if rows else 0.0
    return out


COUNTERS = ("passes", "bucket_runs", "split_passes", "rows", "padded_rows")


def counters_since(report: dict, before: dict) -> dict:
    """The layer runner's counters (lever.npu.layers.StaticLayers.report) between two reports."""
    out = {k: report[k] - before[k] for k in COUNTERS}
    rows = out["rows"] + out["padded_rows"]
    out["padded_share"] = round(out["padded_rows"] / rows, 4) if rows else 0.0
    return out


def summed_counters(rows: list[dict]) -> dict:
    """`counters_since` dicts added up (over a mode's runs)."""
    out = {k: sum(r[k] for r in rows) for k in COUNTERS}
    total = out["rows"] + out["padded_rows"]
    out["padded_share"] = round(out["padded_rows"] / total, 4) if total else 0.0
    return out


def backend_line(info: dict, prefix: str = "# ") -> str:
    """One line: `# backend qnn: buckets rows 1,8 x contexts 64, N bucket runs, M split passes, padded rows X%`."""
    sim = " (simulated HTP: timings are not NPU speed)" if info.get("simulated") else ""
    soc = f", SoC {info['soc_model']}" if info.get("soc_model") else ""
    return (f"{prefix}backend {info['backend']}{soc}{sim}: buckets rows {','.join(map(str, info['rows_buckets']))} x "
            f"contexts {','.join(map(str, info['context_buckets']))}, {info['passes']} passes, "
            f"{info['bucket_runs']} bucket runs, {info['split_passes']} split passes (trees over "
            f"{max(info['rows_buckets'])} rows, run in pieces), padded rows share {100 * info['padded_share']:.1f}%"
            + (f", {info['contexts_compiled']} context binaries compiled in {info['compile_s']:.1f} s"
               if info.get("contexts_compiled") else ""))


def overlap_line(overlap: dict, prefix: str = "") -> str:
    """One line of lever.engine.overlap_json: the iterations' wall time against draft + verify."""
    ratio = overlap.get("ratio")
    return (f"{prefix}overlap: iterations {overlap['iteration_s']:.2f} s wall vs draft {overlap['draft_s']:.2f} s + "
            f"verify {overlap['verify_s']:.2f} s + accept {overlap['accept_s']:.2f} s = {overlap['serial_s']:.2f} s; "
            f"{overlap['hidden_s']:.2f} s ran side by side ({100 * overlap['share']:.0f}% of the drafting"
            + (f", x{ratio:.2f}" if ratio else "") + ")")


def run_context_tokens(prompt_tokens: int, new_tokens: int) -> int:
    """The context a run reaches (prompt + new tokens): what picks an npu profile's context bucket."""
    return int(prompt_tokens) + int(new_tokens)
