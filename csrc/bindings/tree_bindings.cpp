// pybind11 glue for lever::TokenTree (csrc/tree/token_tree.h): argument
// checks and conversions only; the work is done by the C++ core.
//
// std::invalid_argument from the core reaches Python as ValueError and
// std::out_of_range (a node index out of range) as IndexError.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tree/token_tree.h"

namespace py = pybind11;

namespace {

using lever::TokenTree;

// `obj` as a 1-D numpy array (lists are converted), checked to be of the given
// numpy kind ('i'/'u' integers, 'b' bool, 'f' float) and, if length >= 0, of
// that length.
py::array as_1d(const py::object& obj, const char* what, const std::string& kinds,
                py::ssize_t length) {
  py::array arr = py::array::ensure(obj);
  if (!arr) {
    PyErr_Clear();
    throw py::value_error(std::string(what) + " must be convertible to a numpy array");
  }
  if (arr.ndim() != 1) {
    throw py::value_error(std::string(what) + " must be 1-D, got " + std::to_string(arr.ndim()) +
                          " dimensions");
  }
  const char kind = arr.dtype().kind();
  if (kinds.find(kind) == std::string::npos) {
    throw py::value_error(std::string(what) + " has the wrong dtype (" +
                          py::str(arr.dtype()).cast<std::string>() + ")");
  }
  if (length >= 0 && arr.shape(0) != length) {
    throw py::value_error(std::string(what) + " has " + std::to_string(arr.shape(0)) +
                          " entries, expected " + std::to_string(length) + " (one per node)");
  }
  return arr;
}

bool is_int32(const py::array& arr) { return arr.dtype().kind() == 'i' && arr.itemsize() == 4; }
bool is_int64(const py::array& arr) { return arr.dtype().kind() == 'i' && arr.itemsize() == 8; }

template <typename T>
using CArray = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  return py::array_t<T>(static_cast<py::ssize_t>(v.size()), v.data());
}

TokenTree from_arrays(const py::object& tokens_obj, const py::object& parents_obj,
                      const py::object& logprobs_obj) {
  const py::array tokens = as_1d(tokens_obj, "tokens", "iu", -1);
  const py::array parents = as_1d(parents_obj, "parents", "iu", tokens.shape(0));
  CArray<float> logprobs;
  const float* logprobs_ptr = nullptr;
  if (!logprobs_obj.is_none()) {
    logprobs = CArray<float>::ensure(as_1d(logprobs_obj, "logprobs", "fiu", tokens.shape(0)));
    logprobs_ptr = logprobs.data();
  }
  const auto n = static_cast<size_t>(tokens.shape(0));
  if (is_int32(tokens) && is_int32(parents)) {
    const auto t = CArray<int32_t>::ensure(tokens);
    const auto p = CArray<int32_t>::ensure(parents);
    return TokenTree::from_arrays(t.data(), p.data(), n, logprobs_ptr);
  }
  const auto t = CArray<int64_t>::ensure(tokens);
  const auto p = CArray<int64_t>::ensure(parents);
  return TokenTree::from_arrays(t.data(), p.data(), n, logprobs_ptr);
}

py::array_t<bool> mask(const TokenTree& tree, int64_t n_cached) {
  const int64_t width = tree.mask_width(n_cached);  // validates n_cached
  py::array_t<bool> out({static_cast<py::ssize_t>(tree.size()), static_cast<py::ssize_t>(width)});
  tree.fill_mask(n_cached, out.mutable_data());
  return out;
}

py::array_t<int64_t> positions(const TokenTree& tree, int64_t n_cached) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(tree.size()));
  tree.fill_positions(n_cached, out.mutable_data());
  return out;
}

py::tuple walk(const TokenTree& tree, const py::object& targets_obj) {
  const py::array targets = as_1d(targets_obj, "tokens_per_node", "i", tree.size());
  lever::WalkResult result;
  if (is_int32(targets)) {
    result = tree.walk(CArray<int32_t>::ensure(targets).data());
  } else if (is_int64(targets)) {
    result = tree.walk(CArray<int64_t>::ensure(targets).data());
  } else {
    throw py::value_error("tokens_per_node must be an int32 or int64 array, got " +
                          py::str(targets.dtype()).cast<std::string>());
  }
  return py::make_tuple(py::cast(result.accepted), result.next_token);
}

py::array_t<int64_t> compaction_indices(const TokenTree& tree, int64_t n_cached,
                                        const std::vector<int>& accepted) {
  py::array_t<int64_t> out(
      static_cast<py::ssize_t>(TokenTree::compaction_size(n_cached, accepted.size())));
  tree.fill_compaction_indices(n_cached, accepted.data(), accepted.size(), out.mutable_data());
  return out;
}

py::tuple subtree_prune(const TokenTree& tree, const py::object& keep_obj) {
  const py::array keep = as_1d(keep_obj, "keep_mask", "b", tree.size());
  lever::PruneResult result = tree.subtree_prune(CArray<bool>::ensure(keep).data());
  std::vector<int64_t> old_to_new(result.old_to_new.begin(), result.old_to_new.end());
  return py::make_tuple(std::move(result.tree), to_numpy(old_to_new));
}

std::string repr(const TokenTree& tree) {
  return "TokenTree(size=" + std::to_string(tree.size()) +
         ", max_depth=" + std::to_string(tree.max_depth()) +
         ", root_token=" + std::to_string(tree.tokens()[0]) + ")";
}

}  // namespace

void bind_tree(py::module_& m) {
  py::class_<TokenTree>(m, "TokenTree", R"doc(Draft token tree verified in one target pass.

Node 0 is the root (the last committed token, KV not yet cached, depth 0);
every other node is a draft token whose parent has a smaller index, so the
verification batch is the nodes in index order. Siblings carry distinct
tokens. The KV cache holds n_cached rows before the tree's rows.
See lever.tree for the full conventions.)doc")
      .def(py::init<int32_t, int>(), py::arg("root_token"), py::arg("capacity_hint") = 64,
           "A tree holding only its root.")
      .def_static("from_arrays", &from_arrays, py::arg("tokens"), py::arg("parents"),
                  py::arg("logprobs") = py::none(),
                  R"doc(Build a tree from per-node arrays (index order).

parents[0] must be -1 and 0 <= parents[i] < i; siblings must carry distinct
tokens; logprobs (optional, root entry ignored) is each node's draft
log-prob given its parent. Raises ValueError naming the first bad node.)doc")
      .def("add", &TokenTree::add, py::arg("parent"), py::arg("token"),
           py::arg("draft_logprob") = 0.0f,
           "Append a draft node under parent; returns its index. ValueError for a parent out "
           "of range or a token parent already has as a child.")
      .def("size", &TokenTree::size, "Number of nodes, root included.")
      .def("__len__", &TokenTree::size)
      .def("__repr__", &repr)
      .def("token", &TokenTree::token, py::arg("i"))
      .def("parent", &TokenTree::parent, py::arg("i"), "Parent index (-1 for the root).")
      .def("depth", &TokenTree::depth, py::arg("i"), "Depth (root: 0).")
      .def("logprob", &TokenTree::logprob, py::arg("i"),
           "Draft log-prob of node i given its parent (root: 0).")
      .def("path_logprob", &TokenTree::path_logprob, py::arg("i"),
           "Sum of the draft log-probs along root..i.")
      .def("children", &TokenTree::children, py::arg("i"), "Children of i, in index order.")
      .def("num_children", &TokenTree::num_children, py::arg("i"))
      .def("child_with_token", &TokenTree::child_with_token, py::arg("i"), py::arg("token"),
           "The child of i carrying token, or -1 (one step of the sampling walk).")
      .def("path", &TokenTree::path, py::arg("i"), "Node indices root..i.")
      .def("is_ancestor", &TokenTree::is_ancestor, py::arg("a"), py::arg("b"),
           "True if a lies on the path root..b (a node is its own ancestor).")
      .def("max_depth", &TokenTree::max_depth)
      .def("nodes_at_depth", &TokenTree::nodes_at_depth, py::arg("d"))
      .def("leaves", &TokenTree::leaves, "Childless nodes, in index order.")
      .def("tokens", [](const TokenTree& t) { return to_numpy(t.tokens()); }, "int32 [n]")
      .def("parents", [](const TokenTree& t) { return to_numpy(t.parents()); },
           "int32 [n] (root: -1)")
      .def("depths", [](const TokenTree& t) { return to_numpy(t.depths()); }, "int32 [n]")
      .def("logprobs", [](const TokenTree& t) { return to_numpy(t.logprobs()); }, "float32 [n]")
      .def("path_logprobs", [](const TokenTree& t) { return to_numpy(t.path_logprobs()); },
           "float32 [n]")
      .def("mask", &mask, py::arg("n_cached"),
           "New bool array [n, n_cached + n], True = may attend: row i has every cached "
           "column and the tree columns of i's ancestors and i.")
      .def("positions", &positions, py::arg("n_cached"),
           "New int64 array [n]: n_cached + depth(i).")
      .def("walk", &walk, py::arg("tokens_per_node"),
           R"doc(Acceptance walk: (accepted_nodes, next_token).

tokens_per_node: int32 or int64 [n], the target's token at each node (only
visited nodes are read). From the root, descend while the current node's
target token is a child's token; accepted_nodes (list, root excluded) are the
nodes descended to, next_token the target token where the walk stopped.)doc")
      .def("compaction_indices", &compaction_indices, py::arg("n_cached"),
           py::arg("accepted_nodes"),
           "int64 rows to keep of a KV cache holding n_cached rows then the tree's n rows: "
           "0..n_cached-1, n_cached (root), n_cached + j for each accepted node j.")
      .def("subtree_prune", &subtree_prune, py::arg("keep_mask"),
           "Drop nodes whose keep_mask (bool [n]) is False with their subtrees: returns "
           "(new_tree, old_to_new int64 [n], -1 for dropped nodes). Kept nodes keep their "
           "order; the root must be kept.");
}
