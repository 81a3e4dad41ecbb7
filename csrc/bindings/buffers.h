// Buffer checks shared by the pybind11 glue files.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "kernels/qmatmul.h"  // ElemType

namespace lever_bindings {

namespace py = pybind11;

// Format character of a buffer, without a byte-order prefix ('<', '=', '@').
inline std::string base_format(const py::buffer_info& info) {
  std::string f = info.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.erase(0, 1);
  return f;
}

// float32 -> kF32, uint16 (bf16 bit patterns) -> kBF16; ValueError otherwise.
inline lever::ElemType float_or_bf16(const py::buffer_info& info, const char* what) {
  const std::string f = base_format(info);
  if (info.itemsize == 4 && f == "f") return lever::ElemType::kF32;
  if (info.itemsize == 2 && f == "H") return lever::ElemType::kBF16;
  throw py::value_error(std::string(what) + " must be float32 or uint16 (bf16 bits), got format '" +
                        info.format + "'");
}

}  // namespace lever_bindings
