// pybind11 glue for lever._native: argument checks and conversions only; the
// work is done by the C++ core (csrc/kernels, csrc/common, csrc/io).
//
// std::invalid_argument thrown by the core reaches Python as ValueError;
// lever::io::FlashReadError as lever.errors.FlashReadError / ChecksumError.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings/buffers.h"
#include "common/allocator.h"
#include "common/parallel.h"
#include "io/checksum.h"
#include "io/flash_reader.h"
#include "kernels/dequant.h"

namespace py = pybind11;

void bind_tree(py::module_& m);     // csrc/bindings/tree_bindings.cpp
void bind_kernels(py::module_& m);  // csrc/bindings/kernel_bindings.cpp
void bind_grower(py::module_& m);   // csrc/bindings/grow_bindings.cpp
void bind_model(py::module_& m);    // csrc/bindings/model_bindings.cpp
void bind_sampler(py::module_& m);  // csrc/bindings/sampler_bindings.cpp
void bind_graph(py::module_& m);    // csrc/bindings/graph_bindings.cpp

namespace {

using lever_bindings::base_format;

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
  const bool is_f16 = dst.itemsize == 2 && fmt == "e";
  if (!is_f32 && !is_bf16 && !is_f16) {
    throw py::value_error("out must be a float32 array, a float16 array or a uint16 array of bf16 bits, "
                          "got format '" + dst.format + "'");
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
  } else if (is_f16) {
    lever::dequantize_to_f16(src_ptr, n_bytes, qtype, static_cast<uint16_t*>(dst.ptr), n_elements);
  } else {
    lever::dequantize_to_bf16(src_ptr, n_bytes, qtype, static_cast<uint16_t*>(dst.ptr),
                              n_elements);
  }
}


// ---------------------------------------------------------------------------
// Flash reader and checksums

using lever::io::FailureKind;
using lever::io::FlashReader;
using lever::io::FlashReadError;

const char* failure_reason(FailureKind kind) {
  switch (kind) {
    case FailureKind::kOpen: return "open";
    case FailureKind::kUnavailable: return "unavailable";
    case FailureKind::kIo: return "io";
    case FailureKind::kShortRead: return "short_read";
    case FailureKind::kChecksum: return "checksum";
    case FailureKind::kCancelled: return "cancelled";
    case FailureKind::kTimeout: return "timeout";
  }
  return "io";
}

// Raises lever.errors.ChecksumError / FlashReadError (LeverError subclasses,
// defined in Python) with label, path, offset and reason attributes.
void set_flash_read_error(const FlashReadError& e) {
  try {
    py::module_ errors = py::module_::import("lever.errors");
    py::object cls = errors.attr(e.kind == FailureKind::kChecksum ? "ChecksumError" : "FlashReadError");
    py::object exc = cls(e.what());
    exc.attr("label") = e.label;
    exc.attr("path") = e.path;
    exc.attr("offset") = e.offset >= 0 ? py::object(py::int_(e.offset)) : py::object(py::none());
    exc.attr("reason") = failure_reason(e.kind);
    PyErr_SetObject(cls.ptr(), exc.ptr());
  } catch (py::error_already_set&) {  // lever.errors not importable: still say what failed
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

uint32_t crc32c(const py::buffer& data, uint32_t value) {
  const py::buffer_info info = data.request();
  require_c_contiguous(info, "data");
  const auto n_bytes = static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize);
  py::gil_scoped_release no_gil;
  return lever::io::crc32c(info.ptr, n_bytes, value);
}

py::object none_if_empty(const std::string& s) {
  return s.empty() ? py::object(py::none()) : py::object(py::str(s));
}

py::dict stats_dict(const FlashReader& reader) {
  const lever::io::ReaderStats s = reader.stats();
  py::dict d;
  d["backend"] = s.backend;
  d["direct"] = s.direct;
  d["fallback_reason"] = none_if_empty(s.fallback_reason());
  d["backend_reason"] = none_if_empty(s.backend_reason);
  d["direct_reason"] = none_if_empty(s.direct_reason);
  d["registered_buffers"] = s.registered_buffers;
  d["huge_pages_requested"] = s.huge_pages_requested;
  d["slot_buffer_bytes"] = s.slot_buffer_bytes;
  d["huge_page_bytes"] = s.huge_page_bytes;
  d["huge_pages_reason"] = none_if_empty(s.huge_pages_reason);
  d["queue_depth"] = s.queue_depth;
  d["chunk_bytes"] = s.chunk_bytes;
  d["pread_threads"] = s.pread_threads;
  d["max_bytes_per_s"] = s.max_bytes_per_s;
  d["crc32c_implementation"] = s.crc32c_implementation;
  d["bytes_read"] = s.bytes_read;
  d["reads"] = s.reads;
  d["extents"] = s.extents;
  d["wait_s"] = s.wait_s;
  d["busy_s"] = s.busy_s;
  d["checksum_s"] = s.checksum_s;
  d["read_timeout_s"] = s.read_timeout_s;
  d["faults"] = none_if_empty(s.faults);
  d["abandoned_reads"] = s.abandoned_reads;
  return d;
}

std::unique_ptr<FlashReader> make_reader(const std::string& path, size_t slot_bytes, int n_slots,
                                         const std::string& backend, bool direct, int queue_depth,
                                         uint32_t chunk_bytes, int pread_threads,
                                         double max_bytes_per_s, bool huge_pages) {
  lever::io::ReaderOptions options;
  options.backend = backend;
  options.direct = direct;
  options.queue_depth = queue_depth;
  options.chunk_bytes = chunk_bytes;
  options.pread_threads = pread_threads;
  options.max_bytes_per_s = max_bytes_per_s;
  options.huge_pages = huge_pages;
  py::gil_scoped_release no_gil;
  return std::make_unique<FlashReader>(path, slot_bytes, n_slots, options);
}

void reader_submit(FlashReader& reader, int slot, uint64_t offset, uint64_t length,
                   std::optional<std::vector<uint32_t>> chunk_crcs, std::string label) {
  std::vector<uint32_t> crcs = chunk_crcs ? std::move(*chunk_crcs) : std::vector<uint32_t>();
  py::gil_scoped_release no_gil;
  reader.submit(slot, offset, length, std::move(crcs), std::move(label));
}

// A read-only uint8 view of the slot; it keeps the reader object alive.
py::array reader_wait(const py::object& self, int slot) {
  FlashReader& reader = self.cast<FlashReader&>();
  lever::io::SlotView view{nullptr, 0};
  {
    py::gil_scoped_release no_gil;
    view = reader.wait(slot);
  }
  py::array_t<uint8_t> array({static_cast<py::ssize_t>(view.length)}, {py::ssize_t{1}},
                             view.data, self);
  array.attr("setflags")(py::arg("write") = false);
  return std::move(array);
}

void reader_read(FlashReader& reader, uint64_t offset, uint64_t length, const py::buffer& out,
                 std::optional<std::vector<uint32_t>> chunk_crcs, const std::string& label) {
  const py::buffer_info info = out.request(/*writable=*/true);
  require_c_contiguous(info, "out");
  const auto n_bytes = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
  if (n_bytes < length) {
    throw py::value_error("read: out holds " + std::to_string(n_bytes) + " bytes, fewer than length " +
                          std::to_string(length));
  }
  const std::vector<uint32_t> crcs = chunk_crcs ? std::move(*chunk_crcs) : std::vector<uint32_t>();
  py::gil_scoped_release no_gil;
  reader.read(offset, length, static_cast<uint8_t*>(info.ptr), crcs, label);
}

void bind_flash_reader(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const FlashReadError& e) {
      set_flash_read_error(e);
    }
  });

  m.def("crc32c", &crc32c, py::arg("data"), py::arg("value") = 0,
        R"doc(CRC32C (Castagnoli) of a C-contiguous buffer's bytes, continuing from
`value` (the CRC of the preceding bytes; zlib convention, so
crc32c(b, crc32c(a)) == crc32c(a + b)). Releases the GIL.)doc");
  m.def("slot_memory_bytes", &lever::io::slot_memory_bytes, py::arg("bytes"), py::arg("huge_pages") = true,
        "Bytes of memory a FlashReader slot buffer of `bytes` takes (huge-page slots of >= 2 MiB: whole 2 MiB pages).");
  m.def("crc32c_implementation", &lever::io::crc32c_implementation,
        "CRC32C code in use: 'sse4.2', 'armv8-crc' or 'slicing-by-8'.");

  py::class_<FlashReader>(m, "FlashReader", R"doc(Asynchronous checksummed reads of one file into aligned slot buffers.
See lever.store.flash_reader.FlashReader for the documented wrapper.)doc")
      .def(py::init(&make_reader), py::arg("path"), py::arg("slot_bytes"), py::arg("n_slots"),
           py::arg("backend") = "auto", py::arg("direct") = true, py::arg("queue_depth") = 8,
           py::arg("chunk_bytes") = 1u << 20, py::arg("pread_threads") = 4,
           py::arg("max_bytes_per_s") = 0.0, py::arg("huge_pages") = true)
      .def("submit", &reader_submit, py::arg("slot"), py::arg("offset"), py::arg("length"),
           py::arg("chunk_crcs") = py::none(), py::arg("label") = "")
      .def("wait", &reader_wait, py::arg("slot"))
      .def("ready", &FlashReader::ready, py::arg("slot"))
      .def("read", &reader_read, py::arg("offset"), py::arg("length"), py::arg("out"),
           py::arg("chunk_crcs") = py::none(), py::arg("label") = "")
      .def("stats", &stats_dict)
      .def("reset_stats", &FlashReader::reset_stats)
      .def("close", &FlashReader::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("closed", &FlashReader::closed)
      .def_property_readonly("path", &FlashReader::path)
      .def_property_readonly("slot_bytes", &FlashReader::slot_bytes)
      .def_property_readonly("n_slots", &FlashReader::n_slots);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Lever's native core (C++): GGUF dequantisation, quantised matmul, a thread pool, the flash reader, token trees, the decoder.";
  // Large buffers go back to the system when freed, few malloc arenas (see common/allocator.h).
  m.attr("allocator_bounded") = lever::bound_allocator();

  m.def("dequantize", &dequantize, py::arg("raw"), py::arg("qtype"), py::arg("out"),
        R"doc(Dequantise GGUF/ggml tensor data into `out`.

raw:   C-contiguous uint8 array, the tensor's bytes (whole blocks).
qtype: ggml type id (see supported_types()).
out:   writable C-contiguous array of exactly the element count the bytes
       encode: float32 for fp32 values, float16 for fp16 values, or uint16
       for bf16 bit patterns (both rounded to nearest-even).
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

  bind_flash_reader(m);

  bind_tree(m);
  bind_grower(m);

  bind_kernels(m);
  bind_model(m);
  bind_sampler(m);
  bind_graph(m);
}
