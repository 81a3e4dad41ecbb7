// TokenTree: the draft token tree that one target pass verifies.
//
// Conventions (shared with python/lever/tree.py; README, "Design"):
//
// - Nodes are numbered 0..size()-1 and a verification batch is the nodes in
//   index order.
// - Node 0 is the ROOT: the last committed token (the target's token from the
//   previous pass), whose KV is not yet in the cache. Its depth is 0, its
//   parent is -1 and its draft log-prob is 0.
// - Every other node is a draft token whose parent has a smaller index, so
//   index order is a topological order. Siblings carry distinct tokens.
// - The KV cache holds `n_cached` committed rows before the tree; the tree's
//   rows follow them, node i in row n_cached + i.
// - Tokens are vocabulary ids (>= 0, int32). Log-probs are natural logs.
//
// Verification inputs (written into caller buffers, no allocation):
// - mask: row-major bool [size(), n_cached + size()], true = may attend. Row i
//   is true on all n_cached cached columns and on the tree columns of i's
//   ancestors and of i itself.
// - positions: int64 [size()], n_cached + depth(i).
//
// Errors: malformed input (bad parent, duplicate sibling token, negative
// n_cached, a bad accepted path, ...) throws std::invalid_argument; a node
// index out of range in an accessor throws std::out_of_range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lever {

// Result of the acceptance walk.
struct WalkResult {
  std::vector<int> accepted;  // accepted draft nodes, root excluded, root-to-leaf order
  int32_t next_token = -1;    // the target's token after the last accepted node
};

// Result of subtree_prune.
struct PruneResult;

class TokenTree {
 public:
  // A tree holding only its root. capacity_hint: expected node count (reserves
  // storage; the tree grows past it as needed).
  explicit TokenTree(int32_t root_token, int capacity_hint = 64);

  // Bulk construction: node i has token tokens[i] and parent parents[i];
  // parents[0] must be -1 and 0 <= parents[i] < i for i > 0; siblings must
  // carry distinct tokens. logprobs (may be null) gives each node's draft
  // log-prob given its parent (logprobs[0] is ignored: the root's is 0).
  // Throws std::invalid_argument naming the first bad node. The int64
  // overload also rejects values that do not fit in int32.
  static TokenTree from_arrays(const int32_t* tokens, const int32_t* parents, size_t n,
                               const float* logprobs = nullptr);
  static TokenTree from_arrays(const int64_t* tokens, const int64_t* parents, size_t n,
                               const float* logprobs = nullptr);
  static TokenTree from_arrays(const std::vector<int32_t>& tokens,
                               const std::vector<int32_t>& parents,
                               const std::vector<float>& logprobs = {});

  // Appends a draft node under `parent` and returns its index (== old size()).
  // Throws std::invalid_argument if parent is out of range, token is negative
  // or parent already has a child with this token.
  int add(int parent, int32_t token, float draft_logprob = 0.0f);

  // --- Structure ---------------------------------------------------------
  int size() const { return static_cast<int>(tokens_.size()); }
  int32_t token(int i) const;
  int parent(int i) const;  // -1 for the root
  int depth(int i) const;
  float logprob(int i) const;       // draft log-prob of node i given its parent (root: 0)
  float path_logprob(int i) const;  // sum of logprob along root..i
  std::vector<int> children(int i) const;  // in index order
  int num_children(int i) const;
  // The child of i carrying `token`, or -1 if there is none.
  int child_with_token(int i, int32_t token) const;
  std::vector<int> path(int i) const;  // root..i, both included
  // True if a lies on the path root..b (a node is its own ancestor, as in the mask).
  bool is_ancestor(int a, int b) const;
  int max_depth() const { return max_depth_; }
  std::vector<int> nodes_at_depth(int d) const;  // in index order; empty if none
  std::vector<int> leaves() const;               // childless nodes, in index order

  // Flat views of the per-node arrays (size() entries each).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& parents() const { return parents_; }
  const std::vector<int32_t>& depths() const { return depths_; }
  const std::vector<float>& logprobs() const { return logprobs_; }
  const std::vector<float>& path_logprobs() const { return path_logprobs_; }

  // --- Verification inputs -----------------------------------------------
  // Columns of the mask: n_cached + size(). Throws if n_cached < 0.
  int64_t mask_width(int64_t n_cached) const;
  // Writes the [size(), n_cached + size()] row-major mask (see top of file)
  // into out, which must hold size() * mask_width(n_cached) bools.
  void fill_mask(int64_t n_cached, bool* out) const;
  // Writes size() positions, n_cached + depth(i), into out.
  void fill_positions(int64_t n_cached, int64_t* out) const;

  // --- Acceptance --------------------------------------------------------
  // Greedy-style walk given the target's token for each node (array of
  // size() entries; only the visited nodes are read): start at the root; with
  // t = target[current], descend to the child carrying t if there is one and
  // accept it, else stop with next_token = t. Throws std::invalid_argument if
  // a visited node's target token is negative (or, int64, not an int32).
  WalkResult walk(const int32_t* target_token_per_node) const;
  WalkResult walk(const int64_t* target_token_per_node) const;

  // KV rows to keep when the cache holds n_cached rows followed by the tree's
  // size() rows: 0..n_cached-1, then n_cached + 0 (root), then n_cached + j
  // for each accepted node j; strictly increasing. `accepted` must be a path
  // from the root (as returned by walk): accepted[0] a child of the root and
  // each next one a child of the previous one; else std::invalid_argument.
  // compaction_size(k) = n_cached + 1 + k entries are written to out.
  static int64_t compaction_size(int64_t n_cached, size_t n_accepted);
  void fill_compaction_indices(int64_t n_cached, const int* accepted, size_t n_accepted,
                               int64_t* out) const;
  std::vector<int64_t> compaction_indices(int64_t n_cached,
                                          const std::vector<int>& accepted) const;

  // --- Pruning -----------------------------------------------------------
  // Drops every node whose keep_mask entry is false together with its whole
  // subtree; the kept nodes stay in their relative order. keep_mask holds
  // size() entries and keep_mask[0] (the root) must be true.
  PruneResult subtree_prune(const bool* keep_mask) const;
  PruneResult subtree_prune(const std::vector<bool>& keep_mask) const;

 private:
  void check_node(int i) const;  // throws std::out_of_range
  int find_child(int i, int32_t token) const;  // child_with_token without the range check
  template <typename Int>
  static TokenTree from_arrays_impl(const Int* tokens, const Int* parents, size_t n,
                                    const float* logprobs);
  template <typename Int>
  WalkResult walk_impl(const Int* target) const;
  int append(int parent, int32_t token, float draft_logprob);  // no checks

  std::vector<int32_t> tokens_;
  std::vector<int32_t> parents_;
  std::vector<int32_t> depths_;
  std::vector<float> logprobs_;
  std::vector<float> path_logprobs_;
  // Children as linked lists in index order: first/last child, next sibling (-1: none).
  std::vector<int32_t> first_child_;
  std::vector<int32_t> last_child_;
  std::vector<int32_t> next_sibling_;
  int max_depth_ = 0;
};

struct PruneResult {
  TokenTree tree;
  std::vector<int> old_to_new;  // size() of the old tree; -1 for a dropped node
};

}  // namespace lever
