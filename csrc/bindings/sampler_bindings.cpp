// pybind11 glue for the position-keyed sampler (csrc/model/sampler.h):
// argument checks and conversions only. std::invalid_argument reaches Python
// as ValueError.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/buffers.h"
#include "model/sampler.h"

namespace py = pybind11;

namespace {

using lever_bindings::base_format;

// A non-empty 1-D contiguous float32 array: (data, elements).
std::pair<const float*, size_t> f32_row(const py::buffer_info& info, const char* what) {
  if (info.ndim != 1 || info.itemsize != 4 || base_format(info) != "f" ||
      (info.shape[0] > 1 && info.strides[0] != 4) || info.shape[0] < 1) {
    throw py::value_error(std::string(what) + " must be a non-empty contiguous 1-D float32 array");
  }
  return {static_cast<const float*>(info.ptr), static_cast<size_t>(info.shape[0])};
}

int64_t sample_position(const py::buffer& logits, double temperature, int64_t top_k, double top_p,
                        uint64_t seed, uint64_t position) {
  const py::buffer_info info = logits.request();
  const auto row = f32_row(info, "logits");
  py::gil_scoped_release no_gil;
  return lever::sample_position(row.first, row.second, temperature, top_k, top_p, seed, position);
}

py::array_t<float> processed_scores(const py::buffer& logits, double temperature, int64_t top_k,
                                    double top_p) {
  const py::buffer_info info = logits.request();
  const auto row = f32_row(info, "logits");
  py::array_t<float> out(static_cast<py::ssize_t>(row.second));
  float* dst = out.mutable_data();
  py::gil_scoped_release no_gil;
  lever::processed_scores(row.first, row.second, temperature, top_k, top_p, dst);
  return out;
}

py::array_t<double> position_noise(uint64_t seed, uint64_t position, int64_t n) {
  if (n < 0) throw py::value_error("n must be >= 0, got " + std::to_string(n));
  py::array_t<double> out(static_cast<py::ssize_t>(n));
  lever::position_noise(seed, position, static_cast<size_t>(n), out.mutable_data());
  return out;
}

}  // namespace

void bind_sampler(py::module_& m) {
  m.def("sample_position", &sample_position, py::arg("logits"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("position"),
        R"doc(The position-keyed Gumbel-max draw of lever.sampling.sample_at: the token
id argmax(processed logits (float32, widened) + Gumbel noise (float64) of
(seed, position)), the first id on ties. logits: contiguous 1-D float32
[vocab]; temperature > 0 (greedy is the caller's argmax); top_k 0 or >= vocab
disables top-k; top_p 1 disables top-p. Releases the GIL. ValueError for a bad
argument.)doc");
  m.def("processed_scores", &processed_scores, py::arg("logits"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"),
        R"doc(The processed logits (float32 [vocab], dropped tokens -inf) the native draw
uses: lever.sampling.processed_logits up to the float rounding noted in
csrc/model/sampler.h (a token at the top-p boundary). For tests.)doc");
  m.def("position_noise", &position_noise, py::arg("seed"), py::arg("position"), py::arg("n"),
        R"doc(Gumbel noise (float64 [n]) of tokens 0..n-1 at (seed, position), as
lever.sampling.position_noise computes it, with libm's log. For tests.)doc");
}
