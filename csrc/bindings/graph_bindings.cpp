// pybind11 glue for lever::BucketPlanner (csrc/graph/bucket_planner.h):
// argument checks and conversions only; the planning and packing are done by
// the C++ core. std::invalid_argument reaches Python as ValueError.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/buffers.h"
#include "graph/bucket_planner.h"

namespace py = pybind11;

namespace {

using lever::BucketChunk;
using lever::BucketPlanner;
using lever_bindings::base_format;

// A C-contiguous numpy buffer of `ndim` dimensions whose format is one of
// `formats` (single characters) with `itemsize`-byte elements; its data
// pointer and shape. ValueError naming `what` otherwise.
struct Array {
  void* ptr = nullptr;
  std::vector<int64_t> shape;
};

Array checked_array(const py::buffer& b, const char* what, py::ssize_t ndim, const char* formats,
                    py::ssize_t itemsize, const char* dtype, bool writable) {
  const py::buffer_info info = b.request();
  const std::string f = base_format(info);
  if (info.itemsize != itemsize || f.size() != 1 ||
      std::string(formats).find(f[0]) == std::string::npos) {
    throw py::value_error(std::string(what) + " must be a " + dtype + " array, got format '" +
                          info.format + "'");
  }
  if (info.ndim != ndim) {
    throw py::value_error(std::string(what) + " must be " + std::to_string(ndim) + "-D, got " +
                          std::to_string(info.ndim) + " dimensions");
  }
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    const auto d = static_cast<size_t>(i);
    if (info.shape[d] != 1 && info.strides[d] != expected) {
      throw py::value_error(std::string(what) +
                            " must be C-contiguous (use numpy.ascontiguousarray)");
    }
    expected *= info.shape[d];
  }
  if (writable && info.readonly) throw py::value_error(std::string(what) + " must be writable");
  Array a;
  a.ptr = info.ptr;
  for (py::ssize_t d : info.shape) a.shape.push_back(static_cast<int64_t>(d));
  return a;
}

Array int64_vector(const py::buffer& b, const char* what, bool writable) {
  return checked_array(b, what, 1, "lq", 8, "1-D int64", writable);
}

py::tuple choose(const BucketPlanner& p, int64_t n_rows, int64_t past) {
  const std::pair<int64_t, int64_t> nc = p.choose(n_rows, past);
  return py::make_tuple(nc.first, nc.second);
}

py::list chunks(const BucketPlanner& p, int64_t n_rows, int64_t past) {
  py::list out;
  for (const BucketChunk& c : p.chunks(n_rows, past)) {
    out.append(py::make_tuple(c.start, c.end, c.rows, c.context));
  }
  return out;
}

void pack(const BucketPlanner& p, const py::buffer& tokens, const py::buffer& positions,
          const py::buffer& mask, int64_t past, int64_t start, int64_t end, int64_t rows_bucket,
          int64_t context_bucket, const py::buffer& ids_out, const py::buffer& positions_out,
          const py::buffer& mask_out) {
  const Array t = int64_vector(tokens, "tokens", false);
  const Array pos = int64_vector(positions, "positions", false);
  const Array m = checked_array(mask, "mask", 2, "?", 1, "2-D bool", false);
  const Array ids = int64_vector(ids_out, "ids_out", true);
  const Array pos_out = int64_vector(positions_out, "positions_out", true);
  const Array m_out = checked_array(mask_out, "mask_out", 2, "f", 4, "2-D float32", true);

  lever::PackSource src;
  src.tokens = static_cast<const int64_t*>(t.ptr);
  src.n_tokens = t.shape[0];
  src.positions = static_cast<const int64_t*>(pos.ptr);
  src.n_positions = pos.shape[0];
  src.mask = static_cast<const bool*>(m.ptr);
  src.mask_rows = m.shape[0];
  src.mask_cols = m.shape[1];
  lever::PackTarget dst;
  dst.ids = static_cast<int64_t*>(ids.ptr);
  dst.n_ids = ids.shape[0];
  dst.positions = static_cast<int64_t*>(pos_out.ptr);
  dst.n_positions = pos_out.shape[0];
  dst.mask = static_cast<float*>(m_out.ptr);
  dst.mask_rows = m_out.shape[0];
  dst.mask_cols = m_out.shape[1];
  py::gil_scoped_release no_gil;
  p.pack(src, past, start, end, rows_bucket, context_bucket, dst);
}

std::string repr(const BucketPlanner& p) {
  auto join = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  return "BucketPlanner(rows=" + join(p.rows()) + ", contexts=" + join(p.contexts()) + ")";
}

}  // namespace

void bind_graph(py::module_& m) {
  py::class_<BucketPlanner>(m, "BucketPlanner", R"doc(Static-shape buckets of a compiled NPU graph (lever.npu.buckets).

BucketPlanner(rows, contexts): row buckets N (new rows = tokens a graph call
runs) and context buckets C (past rows = KV cache rows it reads); each list
is sorted and de-duplicated, must be non-empty and hold values >= 1
(ValueError otherwise). Units: rows = tokens.)doc")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>>(), py::arg("rows"),
           py::arg("contexts"))
      .def_property_readonly("rows", &BucketPlanner::rows, "Row buckets (tokens), ascending.")
      .def_property_readonly("contexts", &BucketPlanner::contexts,
                             "Context buckets (past rows = tokens), ascending.")
      .def_property_readonly("max_rows", &BucketPlanner::max_rows, "Largest row bucket (tokens).")
      .def_property_readonly("max_context", &BucketPlanner::max_context,
                             "Largest context bucket (tokens).")
      .def_property_readonly_static(
          "MASKED", [](const py::object&) { return lever::kMaskedLogit; },
          "Additive mask value of a column a row may not attend (-1e4; 0.0 = attended).")
      .def("__repr__", &repr)
      .def("choose", &choose, py::arg("n_rows"), py::arg("past"),
           R"doc((rows_bucket, context_bucket) to run n_rows new rows (tokens) with past rows
already in the KV cache: the smallest row bucket >= n_rows and the smallest
context bucket >= past. ValueError if n_rows < 1, past < 0, n_rows > max_rows
or past > max_context.)doc")
      .def("chunks", &chunks, py::arg("n_rows"), py::arg("past"),
           R"doc(List of (start, end, rows_bucket, context_bucket): rows [0, n_rows) split
into consecutive chunks of at most max_rows rows (tokens). Chunk [start, end)
runs with past + start rows in the cache (the earlier chunks' rows are cached
by then) and gets choose(end - start, past + start). ValueError if n_rows < 1,
past < 0 or a chunk's past exceeds max_context.)doc")
      .def("pack", &pack, py::arg("tokens"), py::arg("positions"), py::arg("mask"),
           py::arg("past"), py::arg("start"), py::arg("end"), py::arg("rows_bucket"),
           py::arg("context_bucket"), py::arg("ids_out"), py::arg("positions_out"),
           py::arg("mask_out"),
           R"doc(Write the graph inputs of tree rows [start, end) into the output arrays.

Inputs (the whole tree, T rows = tokens, `past` rows cached before it):
tokens int64 [T], positions int64 [T], mask bool [T, past + T] (True = may
attend; TokenTree.mask(past)). Outputs (C-contiguous, writable), with
N = rows_bucket, C = context_bucket, n = end - start, P = past + start:
ids_out int64 [N], positions_out int64 [N]: the n real rows, then 0;
mask_out float32 [N, C + N], additive (0.0 attended, MASKED otherwise):
columns 0..C-1 are the past (tree mask columns 0..P-1, then padding),
columns C..C+N-1 the chunk's rows (tree columns P..P+n-1, then padding);
a padding row attends only its own column C + i.
ValueError for a bad dtype/shape/layout, start >= end, end > T, n > N,
P > C, or a real row that attends a column at or beyond past + end (a row of
a later chunk). Releases the GIL.)doc");
}
