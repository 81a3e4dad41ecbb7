# Cross-compiling for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu.
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Binaries run here under qemu-user: `qemu-aarch64-static -L /usr/aarch64-linux-gnu ./prog`
# (CMAKE_CROSSCOMPILING_EMULATOR makes ctest do that by itself).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(LEVER_CROSS_PREFIX aarch64-linux-gnu- CACHE STRING "prefix of the cross compiler's programs")
set(CMAKE_C_COMPILER ${LEVER_CROSS_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${LEVER_CROSS_PREFIX}g++)

set(LEVER_CROSS_SYSROOT /usr/aarch64-linux-gnu CACHE PATH "the target's libraries (for qemu's -L)")
set(CMAKE_FIND_ROOT_PATH ${LEVER_CROSS_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

find_program(LEVER_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(LEVER_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${LEVER_QEMU_AARCH64} -L ${LEVER_CROSS_SYSROOT})
endif()
