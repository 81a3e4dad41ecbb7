"""ONNX Runtime sessions for the static-shape backends.

Two backends run the same bucket graphs (lever.npu.graph):

- ``cpu-static``: ONNX Runtime's CPU execution provider, float32.  Any
  machine with `onnxruntime`; the reference for the NPU path's shapes.
- ``qnn``: Qualcomm's QNN execution provider (the `onnxruntime-qnn`
  package) on its HTP backend, float16.  On a Snapdragon phone that is the
  NPU; on an x86-64 host the package runs the HTP *in simulation* -- correct
  numbers, but its timings say nothing about a phone's.

`QnnTarget` names the chip the HTP graphs are prepared for (SoC model + HTP
architecture, `SOCS`); the HTP computes in float16 for a named SoC, as the
phone does.  Precision settings leak across QNN sessions of one process, so
a process uses one `QnnTarget` (`session` refuses a second).

Every session sets `session.disable_cpu_ep_fallback` for qnn: a node the
HTP cannot run is an error, never a quiet CPU fallback.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from ..errors import LeverError
from ..extras import install_hint

BACKENDS = ("cpu-static", "qnn")
GRAPH_DTYPE = {"cpu-static": "float32", "qnn": "float16"}
# SoC model id -> (chip, HTP architecture) of the Snapdragon parts whose
# context binaries onnxruntime-qnn 2.7 (QAIRT 2.51) was seen to prepare.
SOCS = {"57": ("SM8650 (Snapdragon 8 Gen 3)", "75"),
        "43": ("SM8550 (Snapdragon 8 Gen 2)", "73"),
        "69": ("SM8750 (Snapdragon 8 Elite)", "79")}
DEFAULT_SOC = "57"
INSTALL_HINT = install_hint("npu")


class NpuError(LeverError):
    """A static-shape backend cannot run: a missing package, a bad SoC, a stale context."""


@dataclass(frozen=True)
class QnnTarget:
    """The Snapdragon part HTP graphs are prepared for; `check` validates it."""

    soc_model: str = DEFAULT_SOC
    htp_arch: str = ""               # "" = the SoC's own

    def __post_init__(self) -> None:
        soc, arch = str(self.soc_model), str(self.htp_arch)
        if soc not in SOCS:
            raise NpuError(f"unsupported SoC model {soc!r}: choose one of "
                           + ", ".join(f"{k} ({v[0]}, HTP v{v[1]})" for k, v in SOCS.items()))
        want = SOCS[soc][1]
        if arch and arch != want:
            raise NpuError(f"SoC model {soc} ({SOCS[soc][0]}) has HTP architecture v{want}, not v{arch}")
        object.__setattr__(self, "soc_model", soc)
        object.__setattr__(self, "htp_arch", want)

    @property
    def chip(self) -> str:
        return SOCS[self.soc_model][0]

    def provider_options(self) -> dict[str, str]:
        return {"backend_type": "htp", "soc_model": self.soc_model, "htp_arch": self.htp_arch,
                "enable_htp_fp16_precision": "1"}


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise NpuError(f"unknown static backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return name


def onnxruntime():
    """The onnxruntime module, or an NpuError saying how to install it."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise NpuError(f"the static-shape backends need onnxruntime, which is not installed ({INSTALL_HINT})") from None
    return ort


def versions() -> dict[str, str]:
    """onnxruntime's version and, when installed, onnxruntime-qnn's and its QNN SDK's."""
    out = {"onnxruntime": onnxruntime().__version__}
    try:
        from onnxruntime_qnn import build_and_package_info as info
    except ImportError:
        return out
    out["onnxruntime_qnn"] = str(getattr(info, "__version__", "unknown"))
    out["qnn"] = str(getattr(info, "qnn_version", "unknown"))
    return out


_qnn_devices = None
_qnn_target: QnnTarget | None = None


def qnn_devices():
    """The QNN execution provider's devices, registering its plugin library once."""
    global _qnn_devices
    if _qnn_devices is not None:
        return _qnn_devices
    ort = onnxruntime()
    try:
        import onnxruntime_qnn
    except ImportError:
        raise NpuError(f"--backend qnn needs the onnxruntime-qnn package, which is not installed ({INSTALL_HINT})") from None
    with quiet_stdout():
        try:
            ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
        except Exception as e:                      # already registered by another caller in this process
            if "already" not in str(e).lower():
                raise NpuError(f"cannot load the QNN execution provider: {e}") from None
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        raise NpuError("onnxruntime-qnn is installed but lists no QNN device")
    _qnn_devices = devices
    return devices


@contextlib.contextmanager
def quiet_stdout():
    """Keep lines the QNN libraries print to file descriptor 1 out of stdout
    (they would corrupt machine-readable output); they go to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def session_options(backend: str, threads: int, target: QnnTarget | None = None, config: dict | None = None):
    """SessionOptions for one bucket session of `backend` (config: extra session entries)."""
    global _qnn_target
    ort = onnxruntime()
    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, int(threads))
    so.inter_op_num_threads = 1
    so.log_severity_level = 3                       # errors only: the EP's warnings are noise to a user
    for key, value in (config or {}).items():
        so.add_session_config_entry(key, str(value))
    if backend == "qnn":
        target = target or QnnTarget()
        if _qnn_target is not None and _qnn_target != target:
            raise NpuError(f"this process already prepared QNN graphs for SoC {_qnn_target.soc_model}; "
                           f"precision settings leak across sessions, so use one SoC per process")
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.add_provider_for_devices(qnn_devices(), target.provider_options())
        _qnn_target = target
    return so


def create_session(model, backend: str, threads: int = 1, target: QnnTarget | None = None,
                   config: dict | None = None):
    """An InferenceSession of `model` (bytes or a path) on `backend`."""
    ort = onnxruntime()
    so = session_options(check_backend(backend), threads, target, config)
    providers = ["CPUExecutionProvider"] if backend == "cpu-static" else None
    model = str(model) if isinstance(model, os.PathLike) else model
    with quiet_stdout():
        try:
            return ort.InferenceSession(model, so, providers=providers) if providers \
                else ort.InferenceSession(model, so)
        except Exception as e:
            raise NpuError(f"onnxruntime could not prepare a {backend} session: {str(e).splitlines()[0]}") from None
