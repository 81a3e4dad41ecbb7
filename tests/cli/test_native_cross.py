"""Native C++ tests and lever-kbench, built with CMake outside the wheel.

1. x86-64 (the host): configure with -DLEVER_BUILD_TESTS=ON
   -DLEVER_BUILD_KBENCH=ON, build, run ctest (tests/native/*.cpp) and
   `lever-kbench --quick --json`, and check the JSON covers every quantised
   type and every M.
2. aarch64 (cmake/aarch64-linux-gnu.cmake): cross-build the same, run ctest
   (the native tests under qemu-user with -cpu max, cortex-a76 and
   cortex-a53: the i8mm, dotprod and plain NEON kernel paths) and
   lever-kbench --quick under qemu, whose output must be labelled emulated.

The aarch64 tests are marked `cross` (`-m "not cross"` leaves them out).
Without cmake, the cross compiler or qemu-aarch64-static these tests skip,
unless LEVER_REQUIRE_CROSS=1 (set by .ci/run), where they fail instead.
Build directories go to a pytest temp dir; builds use 2 jobs.
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from waiting import deadline

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN = ROOT / "cmake" / "aarch64-linux-gnu.cmake"
QUANT_TYPES = {"Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "Q4_1"}
MATMUL_ROWS = {1, 4, 16, 64, 256}
QEMU_CPUS = ("max", "cortex-a76", "cortex-a53")
# The Isa each emulated CPU must dispatch to (printed by lever_native_tests).
QEMU_CPU_ISA = {"max": "i8mm", "cortex-a76": "dotprod", "cortex-a53": "neon"}


def _required() -> bool:
    return os.environ.get("LEVER_REQUIRE_CROSS") == "1"


def _missing(what: str):
    if _required():
        pytest.fail(f"LEVER_REQUIRE_CROSS=1 but {what}")
    pytest.skip(what)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        _missing(f"{name} is not installed")
    return path


def _run(cmd, cwd=None, env=None, timeout=900) -> subprocess.CompletedProcess:
    """Runs cmd, failing the test with its output if it exits non-zero."""
    t0 = time.monotonic()
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, timeout=deadline(timeout),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"$ {' '.join(map(str, cmd))}  ({time.monotonic() - t0:.1f} s)")
    if p.returncode != 0:
        pytest.fail(f"{cmd[0]} exited {p.returncode}:\n{p.stdout[-6000:]}")
    return p


def _build(build_dir: Path, *extra_args: str) -> None:
    cmake = _tool("cmake")
    _run([cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
          "-DLEVER_BUILD_TESTS=ON", "-DLEVER_BUILD_KBENCH=ON", *extra_args])
    _run([cmake, "--build", build_dir, "-j2"])


def _ctest(build_dir: Path, env=None) -> str:
    return _run([_tool("ctest"), "--test-dir", build_dir, "--output-on-failure",
                 "-V", "-E", "kbench_quick"], env=env).stdout


def _check_kbench_json(path: Path, emulated: bool) -> dict:
    report = json.loads(path.read_text())
    got = {(r["type"], r["M"]) for r in report["qmatmul"]}
    want = {(t, m) for t in QUANT_TYPES for m in MATMUL_ROWS}
    assert want <= got, f"missing (type, M): {sorted(want - got)}"
    for r in report["qmatmul"]:
        assert r["seconds"] > 0 and r["gbps"] > 0 and r["gflops"] > 0
    assert report["attention"] and report["dequant"] and report["flash"]
    assert report["reference"]["dram_read_gbps"] > 0
    assert report["emulated"] is emulated
    # Every flash run names the backend it used, or why it could not run.
    for r in report["flash"]:
        assert r["backend"] in ("io_uring", "pread") or r.get("error"), r
    return report


def test_native_x86(tmp_path):
    build = tmp_path / "build-x86"
    _build(build)
    out = _ctest(build)
    assert "best_isa=" in out and " 0 failed" in out
    json_path = tmp_path / "kbench.json"
    p = _run([build / "lever-kbench", "--quick", "--json", json_path, "--dir", tmp_path])
    assert "EMULATED" not in p.stdout
    report = _check_kbench_json(json_path, emulated=False)
    assert report["arch"] == "x86_64"


@pytest.mark.cross
def test_native_aarch64_under_qemu(tmp_path):
    _tool("aarch64-linux-gnu-g++")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        _missing("qemu-aarch64-static is not installed")
    build = tmp_path / "build-arm64"
    _build(build, f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN}")

    t0 = time.monotonic()
    out = _ctest(build)
    print(f"native tests under qemu ({len(QEMU_CPUS)} CPUs): {time.monotonic() - t0:.1f} s")
    for cpu in QEMU_CPUS:
        assert f"native_tests_qemu_{cpu}" in out
        # Each emulated CPU ran the dispatch path it has.
        assert f"best_isa={QEMU_CPU_ISA[cpu]} " in out and f"QEMU_CPU={cpu}" in out, cpu
    assert "arch=aarch64" in out
    # qemu-user has no io_uring: the reader fell back to pread and said so
    # (tests/native/test_emulation.cpp, under each CPU).
    assert out.count("[  OK  ] emulated_reader_reports_pread_fallback") == len(QEMU_CPUS)

    # lever-kbench under qemu (no LEVER_EMULATED: it must notice by itself
    # from QEMU_CPU or /proc/cpuinfo) is labelled emulated.
    env = dict(os.environ, QEMU_CPU="max")
    env.pop("LEVER_EMULATED", None)
    json_path = tmp_path / "kbench-arm64.json"
    p = _run([qemu, "-L", "/usr/aarch64-linux-gnu", build / "lever-kbench", "--quick",
              "--json", json_path, "--dir", tmp_path], env=env, timeout=600)
    assert "EMULATED" in p.stdout
    report = _check_kbench_json(json_path, emulated=True)
    assert report["arch"] == "aarch64"
    assert "not performance" in report["note"]
    # qemu-user has no io_uring: the auto backend fell back to pread and said why.
    auto = [r for r in report["flash"] if r["backend_requested"] == "auto"]
    assert auto and all(r["backend"] == "pread" and r["fallback_reason"] for r in auto), auto


@pytest.mark.cross
def test_static_aarch64_kbench_runs_without_a_sysroot(tmp_path):
    """-DLEVER_STATIC_KBENCH=ON gives a binary that needs no shared libraries
    (as `adb shell` on a phone runs it): qemu runs it with no -L sysroot, and
    with no QEMU_CPU / LEVER_EMULATED in the environment it still labels its
    figures emulated (it sees the host's x86 /proc/cpuinfo)."""
    _tool("aarch64-linux-gnu-g++")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        _missing("qemu-aarch64-static is not installed")
    build = tmp_path / "build-arm64-static"
    cmake = _tool("cmake")
    _run([cmake, "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN}",
          "-DLEVER_BUILD_KBENCH=ON", "-DLEVER_STATIC_KBENCH=ON"])
    _run([cmake, "--build", build, "-j2", "--target", "lever-kbench"])
    env = {k: v for k, v in os.environ.items() if k not in ("QEMU_CPU", "LEVER_EMULATED", "QEMU_LD_PREFIX")}
    json_path = tmp_path / "kbench-static.json"
    p = _run([qemu, "-cpu", "cortex-a76", build / "lever-kbench", "--quick", "--json", json_path,
              "--dir", tmp_path], env=env, timeout=600)
    assert "EMULATED (x86 /proc/cpuinfo" in p.stdout, p.stdout[:500]
    report = _check_kbench_json(json_path, emulated=True)
    assert report["arch"] == "aarch64" and report["isa"] == "dotprod"
