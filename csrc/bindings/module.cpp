// pybind11 glue for lever._native: argument checks and conversions only; the
// work is done by the C++ core (csrc/kernels, csrc/common).
//
// std::invalid_argument thrown by the core reaches Python as ValueError.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "common/parallel.h"
#include "kernels/dequant.h"

namespace py = pybind11;

namespace {

// Format character of a buffer, without a byte-order prefix ('<', '=', '@').
std::string base_format(const py::buffer_info& info) {
  std::string f = info.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.erase(0, 1);
  return f;
}

// Raises ValueError unless the buffer is C-contiguous.
void require_c_contiguous(const py::buffer_info& info, const char* what) {
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    const py::ssize_t extent = info.shape[static_cast<size_t>(i)];
    if (extent != 1 && info.strides[static_cast<size_t>(i)] != expected) {
      throw py::value_error(std::string(what) +
                            " must be C-contiguous (use numpy.ascontiguousarray)");
    }
    expected *= extent;
  }
}

void dequantize(const py::buffer& raw, int qtype, const py::buffer& out) {
  const py::buffer_info src = raw.request();
  const py::buffer_info dst = out.request();  // writability is checked below

  if (src.itemsize != 1 || base_format(src) != "B") {
    throw py::value_error("raw must be a uint8 array, got format '" + src.format +
                          "' (view the bytes with .view(numpy.uint8))");
  }
  require_c_contiguous(src, "raw");

  const std::string fmt = base_format(dst);
  const bool is_f32 = dst.itemsize == 4 && fmt == "f";
  const bool is_bf16 = dst.itemsize == 2 && fmt == "H";
  if (!is_f32 && !is_bf16) {
    throw py::value_error("out must be a float32 array or a uint16 array of bf16 bits, got format '" +
                          dst.format + "'");
  }
  if (dst.readonly) throw py::value_error("out must be writable");
  require_c_contiguous(dst, "out");
  if (reinterpret_cast<uintptr_t>(dst.ptr) % static_cast<uintptr_t>(dst.itemsize) != 0) {
    throw py::value_error("out must be aligned to its element size");
  }

  const auto* src_ptr = static_cast<const uint8_t*>(src.ptr);
  const auto n_bytes = static_cast<size_t>(src.size);
  const auto n_elements = static_cast<size_t>(dst.size);
  py::gil_scoped_release no_gil;
  if (is_f32) {
    lever::dequantize_to_f32(src_ptr, n_bytes, qtype, static_cast<float*>(dst.ptr), n_elements);
  } else {
    lever::dequantize_to_bf16(src_ptr, n_bytes, qtype, static_cast<uint16_t*>(dst.ptr),
                              n_elements);
  }
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Lever's native core (C++): GGUF dequantisation and a thread pool.";

  m.def("dequantize", &dequantize, py::arg("raw"), py::arg("qtype"), py::arg("out"),
        R"doc(Dequantise GGUF/ggml tensor data into `out`.

raw:   C-contiguous uint8 array, the tensor's bytes (whole blocks).
qtype: ggml type id (see supported_types()).
out:   writable C-contiguous array of exactly the element count the bytes
       encode: float32 for fp32 values, or uint16 for bf16 bit patterns
       (rounded to nearest-even).
Raises ValueError for an unsupported type, a size mismatch or a bad buffer.
Releases the GIL and runs on the native thread pool.)doc");

  m.def("supported_types", &lever::supported_types,
        "Supported ggml type ids, ascending.");
  m.def("block_size", &lever::block_size, py::arg("qtype"),
        "Elements per block of a supported ggml type (ValueError otherwise).");
  m.def("type_size", &lever::type_size, py::arg("qtype"),
        "Bytes per block of a supported ggml type (ValueError otherwise).");
  m.def("set_num_threads", &lever::set_num_threads, py::arg("n"),
        "Size the native thread pool to n threads (n <= 0: one per available CPU).");
  m.def("get_num_threads", &lever::get_num_threads,
        "Threads of the native thread pool, the calling thread included.");
}
