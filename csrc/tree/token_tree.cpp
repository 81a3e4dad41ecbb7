// TokenTree: see token_tree.h for the conventions.

#include "tree/token_tree.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

namespace lever {

static_assert(sizeof(bool) == 1, "masks are written as one byte per entry (numpy bool)");

namespace {

std::string str(long long v) { return std::to_string(v); }

// True if v is a valid token id: 0 <= v <= INT32_MAX.
template <typename Int>
bool is_token(Int v) {
  return v >= 0 && static_cast<long long>(v) <= std::numeric_limits<int32_t>::max();
}

// The error for an invalid token v; `what` names the node, e.g. "from_arrays: node 3".
std::invalid_argument token_error(long long v, const std::string& what) {
  return std::invalid_argument(what + ": token " + str(v) +
                               (v < 0 ? " is negative" : " does not fit in int32"));
}

void check_n_cached(int64_t n_cached, const char* fn) {
  if (n_cached < 0) {
    throw std::invalid_argument(std::string(fn) + ": n_cached must be >= 0, got " +
                                str(n_cached));
  }
}

}  // namespace

// --- Construction -------------------------------------------------------------

TokenTree::TokenTree(int32_t root_token, int capacity_hint) {
  if (!is_token(root_token)) throw token_error(root_token, "TokenTree: root");
  const size_t cap = static_cast<size_t>(std::max(capacity_hint, 1));
  tokens_.reserve(cap);
  parents_.reserve(cap);
  depths_.reserve(cap);
  logprobs_.reserve(cap);
  path_logprobs_.reserve(cap);
  first_child_.reserve(cap);
  last_child_.reserve(cap);
  next_sibling_.reserve(cap);

  tokens_.push_back(root_token);
  parents_.push_back(-1);
  depths_.push_back(0);
  logprobs_.push_back(0.0f);
  path_logprobs_.push_back(0.0f);
  first_child_.push_back(-1);
  last_child_.push_back(-1);
  next_sibling_.push_back(-1);
}

int TokenTree::append(int parent, int32_t token, float draft_logprob) {
  const int i = size();
  tokens_.push_back(token);
  parents_.push_back(parent);
  const int d = depths_[parent] + 1;
  depths_.push_back(d);
  logprobs_.push_back(draft_logprob);
  path_logprobs_.push_back(path_logprobs_[parent] + draft_logprob);
  first_child_.push_back(-1);
  last_child_.push_back(-1);
  next_sibling_.push_back(-1);
  if (last_child_[parent] < 0) {
    first_child_[parent] = i;
  } else {
    next_sibling_[last_child_[parent]] = i;
  }
  last_child_[parent] = i;
  max_depth_ = std::max(max_depth_, d);
  return i;
}

int TokenTree::add(int parent, int32_t token, float draft_logprob) {
  if (parent < 0 || parent >= size()) {
    throw std::invalid_argument("add: parent " + str(parent) + " is out of range (the tree has " +
                                str(size()) + " nodes)");
  }
  if (!is_token(token)) throw token_error(token, "add: new node " + str(size()));
  const int existing = child_with_token(parent, token);
  if (existing >= 0) {
    throw std::invalid_argument("add: parent " + str(parent) + " already has a child with token " +
                                str(token) + " (node " + str(existing) + ")");
  }
  return append(parent, token, draft_logprob);
}

template <typename Int>
TokenTree TokenTree::from_arrays_impl(const Int* tokens, const Int* parents, size_t n,
                                      const float* logprobs) {
  if (n == 0) throw std::invalid_argument("from_arrays: no nodes (a tree has at least its root)");
  if (n > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument("from_arrays: too many nodes (" + str(static_cast<long long>(n)) +
                                ")");
  }
  if (parents[0] != -1) {
    throw std::invalid_argument("from_arrays: node 0: parent " + str(parents[0]) +
                                " given, the root's parent must be -1");
  }
  if (!is_token(tokens[0])) throw token_error(tokens[0], "from_arrays: node 0");
  TokenTree tree(static_cast<int32_t>(tokens[0]), static_cast<int>(n));
  for (size_t k = 1; k < n; ++k) {
    const int i = static_cast<int>(k);
    const Int p = parents[k];
    if (p < 0) {
      throw std::invalid_argument("from_arrays: node " + str(i) + ": parent " + str(p) +
                                  " is negative (only the root, node 0, has parent -1)");
    }
    if (p >= static_cast<Int>(i)) {
      throw std::invalid_argument("from_arrays: node " + str(i) + ": parent " + str(p) +
                                  " is not before it");
    }
    if (!is_token(tokens[k])) throw token_error(tokens[k], "from_arrays: node " + str(i));
    const int32_t t = static_cast<int32_t>(tokens[k]);
    const int parent = static_cast<int>(p);
    const int existing = tree.find_child(parent, t);
    if (existing >= 0) {
      throw std::invalid_argument("from_arrays: node " + str(i) + " repeats token " + str(t) +
                                  " under parent " + str(parent) + " (as node " + str(existing) +
                                  ")");
    }
    tree.append(parent, t, logprobs != nullptr ? logprobs[k] : 0.0f);
  }
  return tree;
}

TokenTree TokenTree::from_arrays(const int32_t* tokens, const int32_t* parents, size_t n,
                                 const float* logprobs) {
  return from_arrays_impl(tokens, parents, n, logprobs);
}

TokenTree TokenTree::from_arrays(const int64_t* tokens, const int64_t* parents, size_t n,
                                 const float* logprobs) {
  return from_arrays_impl(tokens, parents, n, logprobs);
}

TokenTree TokenTree::from_arrays(const std::vector<int32_t>& tokens,
                                 const std::vector<int32_t>& parents,
                                 const std::vector<float>& logprobs) {
  if (tokens.size() != parents.size()) {
    throw std::invalid_argument("from_arrays: tokens has " + str(tokens.size()) +
                                " entries but parents has " + str(parents.size()));
  }
  if (!logprobs.empty() && logprobs.size() != tokens.size()) {
    throw std::invalid_argument("from_arrays: logprobs has " + str(logprobs.size()) +
                                " entries but tokens has " + str(tokens.size()));
  }
  return from_arrays_impl(tokens.data(), parents.data(), tokens.size(),
                          logprobs.empty() ? nullptr : logprobs.data());
}

// --- Structure ----------------------------------------------------------------

void TokenTree::check_node(int i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range("node " + str(i) + " is out of range (the tree has " + str(size()) +
                            " nodes)");
  }
}

int TokenTree::find_child(int i, int32_t token) const {
  for (int c = first_child_[i]; c >= 0; c = next_sibling_[c]) {
    if (tokens_[c] == token) return c;
  }
  return -1;
}

int32_t TokenTree::token(int i) const {
  check_node(i);
  return tokens_[i];
}

int TokenTree::parent(int i) const {
  check_node(i);
  return parents_[i];
}

int TokenTree::depth(int i) const {
  check_node(i);
  return depths_[i];
}

float TokenTree::logprob(int i) const {
  check_node(i);
  return logprobs_[i];
}

float TokenTree::path_logprob(int i) const {
  check_node(i);
  return path_logprobs_[i];
}

std::vector<int> TokenTree::children(int i) const {
  check_node(i);
  std::vector<int> out;
  for (int c = first_child_[i]; c >= 0; c = next_sibling_[c]) out.push_back(c);
  return out;
}

int TokenTree::num_children(int i) const {
  check_node(i);
  int count = 0;
  for (int c = first_child_[i]; c >= 0; c = next_sibling_[c]) ++count;
  return count;
}

int TokenTree::child_with_token(int i, int32_t token) const {
  check_node(i);
  return find_child(i, token);
}

std::vector<int> TokenTree::path(int i) const {
  check_node(i);
  std::vector<int> out(static_cast<size_t>(depths_[i]) + 1);
  for (int v = i, k = depths_[i]; v >= 0; v = parents_[v], --k) out[k] = v;
  return out;
}

bool TokenTree::is_ancestor(int a, int b) const {
  check_node(a);
  check_node(b);
  while (depths_[b] > depths_[a]) b = parents_[b];
  return a == b;
}

std::vector<int> TokenTree::nodes_at_depth(int d) const {
  std::vector<int> out;
  for (int i = 0; i < size(); ++i) {
    if (depths_[i] == d) out.push_back(i);
  }
  return out;
}

std::vector<int> TokenTree::leaves() const {
  std::vector<int> out;
  for (int i = 0; i < size(); ++i) {
    if (first_child_[i] < 0) out.push_back(i);
  }
  return out;
}

// --- Verification inputs ------------------------------------------------------

int64_t TokenTree::mask_width(int64_t n_cached) const {
  check_n_cached(n_cached, "mask");
  return n_cached + size();
}

void TokenTree::fill_mask(int64_t n_cached, bool* out) const {
  const size_t width = static_cast<size_t>(mask_width(n_cached));
  const size_t cached = static_cast<size_t>(n_cached);
  const size_t n = static_cast<size_t>(size());
  for (size_t i = 0; i < n; ++i) {
    bool* row = out + i * width;
    std::fill(row, row + cached, true);
    bool* tree_row = row + cached;
    if (i == 0) {
      std::fill(tree_row, tree_row + n, false);
    } else {
      // The parent's row (already written, parent < i) is true exactly on the
      // parent's ancestors and the parent, all at columns <= parent.
      const size_t p = static_cast<size_t>(parents_[i]);
      const bool* parent_row = out + p * width + cached;
      std::memcpy(tree_row, parent_row, (p + 1) * sizeof(bool));
      std::fill(tree_row + p + 1, tree_row + n, false);
    }
    tree_row[i] = true;
  }
}

void TokenTree::fill_positions(int64_t n_cached, int64_t* out) const {
  check_n_cached(n_cached, "positions");
  const int n = size();
  for (int i = 0; i < n; ++i) out[i] = n_cached + depths_[i];
}

// --- Acceptance ---------------------------------------------------------------

template <typename Int>
WalkResult TokenTree::walk_impl(const Int* target) const {
  WalkResult result;
  result.accepted.reserve(static_cast<size_t>(max_depth_));
  int current = 0;
  for (;;) {
    const Int t = target[current];
    if (!is_token(t)) {
      throw std::invalid_argument("walk: target token " + str(t) + " at visited node " +
                                  str(current) + " is not a valid token id");
    }
    const int child = find_child(current, static_cast<int32_t>(t));
    if (child < 0) {
      result.next_token = static_cast<int32_t>(t);
      return result;
    }
    result.accepted.push_back(child);
    current = child;
  }
}

WalkResult TokenTree::walk(const int32_t* target_token_per_node) const {
  return walk_impl(target_token_per_node);
}

WalkResult TokenTree::walk(const int64_t* target_token_per_node) const {
  return walk_impl(target_token_per_node);
}

int64_t TokenTree::compaction_size(int64_t n_cached, size_t n_accepted) {
  check_n_cached(n_cached, "compaction_indices");
  return n_cached + 1 + static_cast<int64_t>(n_accepted);
}

void TokenTree::fill_compaction_indices(int64_t n_cached, const int* accepted, size_t n_accepted,
                                        int64_t* out) const {
  check_n_cached(n_cached, "compaction_indices");
  // Validate before writing anything.
  int previous = 0;
  for (size_t k = 0; k < n_accepted; ++k) {
    const int j = accepted[k];
    if (j < 1 || j >= size()) {
      throw std::invalid_argument("compaction_indices: accepted node " + str(j) + " (entry " +
                                  str(static_cast<long long>(k)) +
                                  ") is not a draft node of this tree (1.." + str(size() - 1) +
                                  ")");
    }
    if (parents_[j] != previous) {
      throw std::invalid_argument(
          "compaction_indices: accepted nodes are not a path from the root: node " + str(j) +
          " (entry " + str(static_cast<long long>(k)) + ") has parent " + str(parents_[j]) +
          ", expected " + str(previous));
    }
    previous = j;
  }
  for (int64_t r = 0; r < n_cached; ++r) out[r] = r;
  out[n_cached] = n_cached;  // the root
  for (size_t k = 0; k < n_accepted; ++k) {
    out[n_cached + 1 + static_cast<int64_t>(k)] = n_cached + accepted[k];
  }
}

std::vector<int64_t> TokenTree::compaction_indices(int64_t n_cached,
                                                   const std::vector<int>& accepted) const {
  std::vector<int64_t> out(static_cast<size_t>(compaction_size(n_cached, accepted.size())));
  fill_compaction_indices(n_cached, accepted.data(), accepted.size(), out.data());
  return out;
}

// --- Pruning ------------------------------------------------------------------

PruneResult TokenTree::subtree_prune(const bool* keep_mask) const {
  if (!keep_mask[0]) {
    throw std::invalid_argument("subtree_prune: the root (node 0) cannot be dropped");
  }
  const int n = size();
  PruneResult result{TokenTree(tokens_[0], n), std::vector<int>(static_cast<size_t>(n), -1)};
  result.old_to_new[0] = 0;
  for (int i = 1; i < n; ++i) {
    const int new_parent = result.old_to_new[parents_[i]];
    if (keep_mask[i] && new_parent >= 0) {
      result.old_to_new[i] = result.tree.append(new_parent, tokens_[i], logprobs_[i]);
    }
  }
  return result;
}

PruneResult TokenTree::subtree_prune(const std::vector<bool>& keep_mask) const {
  if (keep_mask.size() != static_cast<size_t>(size())) {
    throw std::invalid_argument("subtree_prune: keep_mask has " + str(keep_mask.size()) +
                                " entries, the tree has " + str(size()) + " nodes");
  }
  // std::vector<bool> is packed; unpack it into one bool per node.
  const std::unique_ptr<bool[]> flags(new bool[keep_mask.size()]);
  std::copy(keep_mask.begin(), keep_mask.end(), flags.get());
  return subtree_prune(flags.get());
}

}  // namespace lever
