// pybind11 glue for the quantised matmul kernels (csrc/kernels/qmatmul.h):
// argument checks and conversions only.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/buffers.h"
#include "kernels/attention.h"
#include "kernels/dequant.h"
#include "kernels/qmatmul.h"
#include "kernels/repack.h"
#include "model/dense_matmul.h"  // row_bytes

namespace py = pybind11;

namespace {

using lever::ElemType;
using lever::Isa;
using lever_bindings::base_format;
using lever_bindings::float_or_bf16;

// Element type of a 2-D activation / output array: float32, or uint16 holding
// bf16 bits. Rows may be strided; values within a row must be contiguous.
ElemType matrix_type(const py::buffer_info& info, const char* what) {
  if (info.ndim != 2) throw py::value_error(std::string(what) + " must be 2-D");
  const ElemType t = float_or_bf16(info, what);
  if (info.shape[1] > 1 && info.strides[1] != info.itemsize) {
    throw py::value_error(std::string(what) + " rows must be contiguous");
  }
  if (info.shape[0] > 1 && (info.strides[0] < 0 || info.strides[0] % info.itemsize != 0)) {
    throw py::value_error(std::string(what) + " has an unsupported row stride");
  }
  return t;
}

size_t row_stride(const py::buffer_info& info) {
  return info.shape[0] > 1 ? static_cast<size_t>(info.strides[0] / info.itemsize)
                           : static_cast<size_t>(info.shape[1]);
}

void quant_matmul(const py::buffer& x, const py::buffer& w, int qtype, const py::buffer& out,
                  const std::string& isa) {
  const py::buffer_info xi = x.request();
  const py::buffer_info wi = w.request();
  const py::buffer_info yi = out.request();
  const ElemType xt = matrix_type(xi, "x");
  const ElemType yt = matrix_type(yi, "out");
  if (yi.readonly) throw py::value_error("out must be writable");
  if (wi.itemsize != 1 || base_format(wi) != "B") throw py::value_error("w must be a uint8 array");
  if (wi.ndim != 1 && wi.ndim != 2) throw py::value_error("w must be 1-D or 2-D bytes");
  if (wi.strides[wi.ndim - 1] != 1 || (wi.ndim == 2 && wi.strides[0] != wi.shape[1])) {
    throw py::value_error("w must be C-contiguous");
  }
  const auto M = static_cast<size_t>(xi.shape[0]);
  const auto K = static_cast<size_t>(xi.shape[1]);
  const auto N = static_cast<size_t>(yi.shape[1]);
  if (static_cast<size_t>(yi.shape[0]) != M) {
    throw py::value_error("x has " + std::to_string(M) + " rows but out has " +
                          std::to_string(yi.shape[0]));
  }
  if (!lever::has_dot_kernel(qtype)) {
    throw py::value_error(std::string("no quantised matmul kernel for type ") + lever::type_name(qtype));
  }
  const size_t bs = lever::block_size(qtype);
  if (K % bs != 0) {
    throw py::value_error("K = " + std::to_string(K) + " is not a multiple of the block size " +
                          std::to_string(bs));
  }
  const size_t expected = N * (K / bs) * lever::type_size(qtype);
  if (static_cast<size_t>(wi.size) != expected) {
    throw py::value_error("w has " + std::to_string(wi.size) + " bytes; a " + std::to_string(N) +
                          " x " + std::to_string(K) + " " + lever::type_name(qtype) +
                          " matrix has " + std::to_string(expected));
  }
  const Isa chosen = lever::isa_from_name(isa);
  py::gil_scoped_release no_gil;
  lever::quant_matmul(xi.ptr, xt, M, K, row_stride(xi), static_cast<const uint8_t*>(wi.ptr), qtype,
                      N, yi.ptr, yt, row_stride(yi), chosen);
}

// Element strides of a 3-D float32 / bf16 array whose last dimension is contiguous.
ElemType tensor3_type(const py::buffer_info& info, const char* what, size_t* s0, size_t* s1) {
  if (info.ndim != 3) throw py::value_error(std::string(what) + " must be 3-D");
  const ElemType t = float_or_bf16(info, what);
  if (info.shape[2] > 1 && info.strides[2] != info.itemsize) {
    throw py::value_error(std::string(what) + ": the last dimension must be contiguous");
  }
  for (int i = 0; i < 2; ++i) {
    if (info.strides[i] < 0 || info.strides[i] % info.itemsize != 0) {
      throw py::value_error(std::string(what) + " has an unsupported stride");
    }
  }
  *s0 = static_cast<size_t>(info.strides[0] / info.itemsize);
  *s1 = static_cast<size_t>(info.strides[1] / info.itemsize);
  return t;
}

void attention(const py::buffer& q, const py::buffer& k, const py::buffer& v, const py::buffer& mask,
               float scale, const py::buffer& out) {
  const py::buffer_info qi = q.request(), ki = k.request(), vi = v.request();
  const py::buffer_info mi = mask.request(), oi = out.request();
  size_t q_head, q_row, k_head, k_row, v_head, v_row;
  const ElemType qt = tensor3_type(qi, "q", &q_head, &q_row);
  const ElemType kt = tensor3_type(ki, "k", &k_head, &k_row);
  const ElemType vt = tensor3_type(vi, "v", &v_head, &v_row);
  const ElemType ot = matrix_type(oi, "out");
  if (kt != vt || k_head != v_head || k_row != v_row) {
    throw py::value_error("k and v must have the same dtype and strides");
  }
  for (int i = 0; i < 3; ++i) {
    if (ki.shape[i] != vi.shape[i]) throw py::value_error("k and v must have the same shape");
  }
  lever::AttentionShape s{static_cast<size_t>(qi.shape[0]), static_cast<size_t>(ki.shape[0]),
                          static_cast<size_t>(qi.shape[1]), static_cast<size_t>(ki.shape[1]),
                          static_cast<size_t>(qi.shape[2])};
  if (static_cast<size_t>(ki.shape[2]) != s.d) throw py::value_error("q and k head dims differ");
  if (s.n_kv_heads == 0 || s.n_heads % s.n_kv_heads != 0) {
    throw py::value_error("the number of query heads must be a multiple of the kv heads");
  }
  if (mi.itemsize != 1 || mi.ndim != 2 || static_cast<size_t>(mi.shape[0]) != s.T ||
      static_cast<size_t>(mi.shape[1]) != s.L || (s.L > 1 && mi.strides[1] != 1) ||
      (s.T > 1 && static_cast<size_t>(mi.strides[0]) != s.L)) {
    throw py::value_error("mask must be a C-contiguous [T, L] bool array");
  }
  if (static_cast<size_t>(oi.shape[0]) != s.T || static_cast<size_t>(oi.shape[1]) != s.n_heads * s.d) {
    throw py::value_error("out must have shape [T, n_heads * head_dim]");
  }
  if (oi.readonly) throw py::value_error("out must be writable");
  py::gil_scoped_release no_gil;
  lever::attention(s, qi.ptr, qt, q_head, q_row, ki.ptr, vi.ptr, kt, k_head, k_row,
                   static_cast<const uint8_t*>(mi.ptr), scale, oi.ptr, ot, row_stride(oi));
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (Isa isa : lever::kAllIsas) {
    if (lever::isa_available(isa)) out.emplace_back(lever::isa_name(isa));
  }
  return out;
}

std::vector<int> matmul_types() {
  std::vector<int> out;
  for (int t : lever::supported_types()) {
    if (lever::has_dot_kernel(t)) out.push_back(t);
  }
  return out;
}

// A C-contiguous uint8 buffer (1-D or 2-D) of exactly `nbytes` bytes.
void check_bytes(const py::buffer_info& b, size_t nbytes, const char* what, bool writable) {
  if (b.itemsize != 1 || base_format(b) != "B") {
    throw py::value_error(std::string(what) + " must be a uint8 array");
  }
  if (b.ndim < 1 || b.ndim > 2 || b.strides[b.ndim - 1] != 1 ||
      (b.ndim == 2 && b.strides[0] != b.shape[1])) {
    throw py::value_error(std::string(what) + " must be C-contiguous 1-D or 2-D bytes");
  }
  if (writable && b.readonly) throw py::value_error(std::string(what) + " must be writable");
  if (static_cast<size_t>(b.size) != nbytes) {
    throw py::value_error(std::string(what) + " has " + std::to_string(b.size) + " bytes, expected " +
                          std::to_string(nbytes));
  }
}

int repack_rows(const py::buffer& w, int qtype, size_t rows, size_t cols) {
  if (!lever::can_repack(qtype, rows, cols)) {
    throw py::value_error(std::string("a ") + std::to_string(rows) + " x " + std::to_string(cols) +
                          " " + lever::type_name(qtype) + " matrix cannot be repacked");
  }
  const py::buffer_info wi = w.request(true);
  check_bytes(wi, rows * lever::row_bytes(qtype, cols), "w", true);
  py::gil_scoped_release no_gil;
  lever::repack_rows(qtype, static_cast<uint8_t*>(wi.ptr), rows, cols);
  return lever::repacked_type(qtype);
}

py::array_t<uint8_t> unpack_rows(const py::buffer& w, int qtype, size_t rows, size_t cols,
                                 const std::vector<int64_t>& ids) {
  if (!lever::is_repacked_type(qtype)) {
    throw py::value_error(std::string("type ") + std::to_string(qtype) + " is not a repacked type");
  }
  const size_t rb = lever::row_bytes(qtype, cols);
  const py::buffer_info wi = w.request();
  check_bytes(wi, rows * rb, "w", false);
  py::array_t<uint8_t> out({ids.size(), rb});
  uint8_t* dst = out.mutable_data();
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= rows) {
      throw py::value_error("row " + std::to_string(ids[i]) + " is outside the " +
                            std::to_string(rows) + " rows");
    }
    size_t j = i + 1;  // ids[i .. j) are consecutive rows: one call restores them together
    while (j < ids.size() && ids[j] == ids[j - 1] + 1 && static_cast<size_t>(ids[j]) < rows) ++j;
    lever::unpack_rows(qtype, static_cast<const uint8_t*>(wi.ptr), rows, cols,
                       static_cast<size_t>(ids[i]), j - i, dst + i * rb);
    i = j;
  }
  return out;
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("repack_rows", &repack_rows, py::arg("w"), py::arg("qtype"), py::arg("rows"), py::arg("cols"),
        R"doc(Repacks an [rows, cols] matrix of ggml `qtype` in place into groups of 8
interleaved rows (kernels/repack.h) and returns the repacked type id, which
quant_matmul and the decoder accept in its place with bit-identical results.
ValueError if the matrix cannot be repacked (see can_repack).)doc");
  m.def("unpack_rows", &unpack_rows, py::arg("w"), py::arg("qtype"), py::arg("rows"), py::arg("cols"),
        py::arg("ids"),
        "uint8 [len(ids), row bytes]: rows `ids` of a repacked matrix in their original ggml layout.");
  m.def("can_repack", &lever::can_repack, py::arg("qtype"), py::arg("rows"), py::arg("cols"),
        "True if an [rows, cols] matrix of ggml `qtype` has a repacked form.");
  m.def("should_repack", &lever::should_repack,
        "True if resident weights are repacked in this process (the default kernel isa is avx2).");
  m.def("base_type", &lever::base_type, py::arg("qtype"),
        "The ggml type a repacked type id was made from (the id itself otherwise).");
  m.def("quant_matmul", &quant_matmul, py::arg("x"), py::arg("w"), py::arg("qtype"),
        py::arg("out"), py::arg("isa") = "auto",
        R"doc(out[m, n] = sum_k x[m, k] * W[n, k], W given as quantised blocks.

x:     [M, K] float32, or uint16 holding bf16 bits; rows contiguous.
w:     uint8 bytes of the [N, K] weight matrix in ggml blocks of `qtype`
       (N * K / block_size * type_size bytes), e.g. a view of a GGUF file.
out:   writable [M, N] float32 or uint16 (bf16) array.
isa:   'auto' (the process default, see kernel_isa), 'scalar', or one of
       available_isas(): 'avx2', 'avx512' on x86-64; 'neon', 'dotprod', 'i8mm' on aarch64.
Activations are quantised to 8 bits per block first; weights are never
dequantised into memory. Releases the GIL; runs on the native thread pool.)doc");
  m.def("attention", &attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
        py::arg("scale"), py::arg("out"),
        R"doc(Masked grouped-query attention, one query row at a time (row-invariant).

q:     [n_heads, T, d]; k, v: [n_kv_heads, L, d] (float32 or uint16 bf16 bits;
       last dimension contiguous, other strides free).
mask:  C-contiguous bool [T, L]: True where row t may attend to key j.
out:   writable [T, n_heads * d] float32 / uint16, rows contiguous.
A row's output depends only on its query and its unmasked keys/values, never
on the other rows. Releases the GIL; runs on the native thread pool.)doc");
  m.def("matmul_types", &matmul_types, "ggml type ids that quant_matmul accepts, ascending.");
  m.def("available_isas", &available_isas,
        "Kernel instruction sets this CPU can run: scalar, plus avx2 / avx512 (x86-64) or neon / dotprod / i8mm (aarch64).");
  m.def("kernel_isa", [] { return std::string(lever::isa_name(lever::default_isa())); },
        "The instruction set 'auto' resolves to (set_kernel_isa, else LEVER_KERNEL_ISA, else the best).");
  m.def("set_kernel_isa", [](const std::string& name) { lever::set_default_isa(lever::isa_from_name(name)); },
        py::arg("isa"), "Make 'auto' mean this instruction set ('auto' restores the default).");
}
