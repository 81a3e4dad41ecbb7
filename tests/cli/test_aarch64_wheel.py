"""The aarch64 wheel (.ci/aarch64_wheel.sh): cross-compiled on x86-64, repaired
to a manylinux aarch64 tag, then under qemu-user with an arm64 CPython the smoke
test (.ci/aarch64_smoke.py) and the torch-free model tests for every kernel
instruction set the emulated CPU has. About 5 minutes with a cold build on 2
cores (downloads cached under build/aarch64-cache).

Marked `cross` like the other aarch64 builds, and selected like every test by
markers: the default run (CI's) includes it; without the tools it is skipped,
unless LEVER_REQUIRE_CROSS=1 (set by .ci/run), where a missing tool is a
failure. Alone: `python -m pytest tests/cli/test_aarch64_wheel.py`; every
aarch64 build: `python -m pytest -m cross`; everything but them: `python -m
pytest -m "not slow and not cross"`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from waiting import deadline

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "aarch64_wheel.sh"
NEEDED = ("aarch64-linux-gnu-g++", "qemu-aarch64-static", "python3.11", "dpkg", "apt-get")


@pytest.mark.cross
def test_aarch64_wheel_builds_and_passes_under_qemu():
    required = os.environ.get("LEVER_REQUIRE_CROSS") == "1"
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        why = f"needs {', '.join(missing)} (apt-get install g++-aarch64-linux-gnu qemu-user-static)"
        if required:
            pytest.fail(f"LEVER_REQUIRE_CROSS=1 but the aarch64 wheel run {why}")
        pytest.skip(why)
    run = subprocess.run(["bash", str(SCRIPT)], cwd=SCRIPT.parents[1], env=dict(os.environ),
                         capture_output=True, text=True, timeout=deadline(3600))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "== aarch64" in out and "all passed: dist/lever_llm-" in out, out[-3000:]
    assert "_aarch64.whl" in out
