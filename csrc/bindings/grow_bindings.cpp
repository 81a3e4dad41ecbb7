// pybind11 glue for lever::TreeGrower (csrc/tree/grow_tree.h): argument
// checks and conversions only; the growth itself is in the C++ core.
//
// std::invalid_argument from the core reaches Python as ValueError and
// std::out_of_range as IndexError.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tree/grow_tree.h"

namespace py = pybind11;

namespace {

using lever::GrowCosts;
using lever::TreeGrower;

template <typename T>
using CArray = py::array_t<T, py::array::c_style | py::array::forcecast>;

std::vector<double> seconds(const py::object& obj, const char* what) {
  const auto arr = CArray<double>::ensure(obj);
  if (!arr || arr.ndim() != 1) {
    PyErr_Clear();
    throw py::value_error(std::string(what) + " must be a 1-D array of seconds");
  }
  return std::vector<double>(arr.data(), arr.data() + arr.shape(0));
}

// hidden_draft_s: one number of seconds (every n) or a 1-D array per n.
std::vector<double> hidden_seconds(const py::object& obj) {
  if (py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj)) return {obj.cast<double>()};
  return seconds(obj, "hidden_draft_s");
}

TreeGrower make_grower(const py::object& verify_s, const py::object& draft_s, double overhead_s,
                       int max_nodes, int max_depth, const py::object& hidden_draft_s) {
  return TreeGrower(GrowCosts{seconds(verify_s, "verify_s"), seconds(draft_s, "draft_s"), overhead_s,
                              hidden_seconds(hidden_draft_s)},
                    max_nodes, max_depth);
}

void add_children(TreeGrower& g, int node, const py::object& tokens_obj, const py::object& logprobs_obj,
                  const py::object& accept_obj) {
  const auto tokens = CArray<int32_t>::ensure(tokens_obj);
  const auto logprobs = CArray<float>::ensure(logprobs_obj);
  const auto accept = CArray<double>::ensure(accept_obj);
  if (!tokens || !logprobs || !accept || tokens.ndim() != 1 || logprobs.ndim() != 1 || accept.ndim() != 1) {
    PyErr_Clear();
    throw py::value_error("tokens, logprobs and accept must be 1-D arrays");
  }
  if (logprobs.shape(0) != tokens.shape(0) || accept.shape(0) != tokens.shape(0)) {
    throw py::value_error("tokens, logprobs and accept must have the same length");
  }
  g.add_children(node, tokens.data(), logprobs.data(), accept.data(), static_cast<int>(tokens.shape(0)));
}

py::tuple select_tree(const TreeGrower& g) {
  lever::GrownTree grown = g.select();
  std::vector<int64_t> index(grown.pool_index.begin(), grown.pool_index.end());
  py::array_t<int64_t> pool_index(static_cast<py::ssize_t>(index.size()), index.data());
  return py::make_tuple(std::move(grown.tree), pool_index, grown.expected_tokens, grown.predicted_s);
}

}  // namespace

void bind_grower(py::module_& m) {
  py::class_<TreeGrower>(m, "TreeGrower", R"doc(Gain-cost growth of a draft tree (README, "Design").

TreeGrower(verify_s, draft_s, overhead_s, max_nodes, max_depth, hidden_draft_s=0.0):
verify_s[n-1] is the predicted seconds of a target pass over n tree tokens (root
included), draft_s[f-1] of a draft forward over f nodes, overhead_s fixed seconds
per iteration, hidden_draft_s draft seconds hidden under the target's prefetch
reads (CostModel.hidden_draft_curve; not charged): one number, or an array with
entry n-1 for a pass over n tokens (the last entry holds past its end).
Maximises expected tokens per second, (1 + sum of calibrated path
probabilities) / (max(0, draft seconds - hidden_draft_s(n)) + verify_s(n) +
overhead_s). Use:
begin(root, child_accept); loop nodes = next_expansion() until empty, feeding
each node's draft children with add_children; then select().
See lever.draft.gain_cost for the Python side.)doc")
      .def(py::init(&make_grower), py::arg("verify_s"), py::arg("draft_s"), py::arg("overhead_s"),
           py::arg("max_nodes"), py::arg("max_depth"), py::arg("hidden_draft_s") = py::float_(0.0))
      .def("begin", &TreeGrower::begin, py::arg("root_token"), py::arg("child_accept"),
           py::arg("root_extra_s") = 0.0,
           "Start a tree at root_token; child_accept[d-1][r] is the expected acceptance of a "
           "rank-r child at depth d (predictions only); root_extra_s: seconds added to the "
           "forward that expands the root (the draft catching up).")
      .def("add_children", &add_children, py::arg("node"), py::arg("tokens"), py::arg("logprobs"),
           py::arg("accept"),
           "The draft's top children of an expanded node, in rank order: token ids, draft "
           "log-probs, calibrated P(child accepted | node accepted).")
      .def("next_expansion", &TreeGrower::next_expansion,
           "Pool nodes to run through the draft next (empty: growth is finished); their "
           "predicted draft seconds are charged at once.")
      .def("select", &select_tree,
           "The best tree: (TokenTree, pool_index int64 [n], expected_tokens, predicted_s).")
      .def_property_readonly("pool", &TreeGrower::pool, py::return_value_policy::reference_internal,
                             "Every known node (TokenTree; pool index = arrival order).")
      .def("path_prob", &TreeGrower::path_prob, py::arg("node"))
      .def("rank", &TreeGrower::rank, py::arg("node"), "Rank among the node's draft siblings.")
      .def_property_readonly("draft_spent_s", &TreeGrower::draft_spent_s,
                             "Predicted draft seconds charged so far.")
      .def_property_readonly("expansions", &TreeGrower::expansions)
      .def_property_readonly(
          "hidden_draft_s",
          [](const TreeGrower& g) {
            const auto& h = g.costs().hidden_draft_s;
            return h.size() == 1 ? py::object(py::float_(h[0])) : py::object(py::cast(h));
          },
          "Draft seconds not charged (hidden under the target's prefetch reads): one number, or "
          "one per pass size n (entry n-1).");
}
