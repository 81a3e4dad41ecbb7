// TreeGrower: gain-cost growth of a draft token tree (README, "Design").
//
// One iteration of speculative decoding spends
//     T(n) = max(0, draft seconds spent - hidden_draft_s(n)) + verify_s(n) + overhead_s
// on a tree of n tokens (root included) and emits, in expectation,
//     G = 1 + sum over draft nodes v of P(v accepted)
// tokens, where P(v accepted) is the product of the calibrated acceptance
// probabilities along the path root..v (the "path probability"). The grower
// maximises G / T, the expected tokens per second of the iteration.
//
// It alternates with the draft model:
//
//   begin(root)                         the pool holds the root only
//   loop:
//     nodes = next_expansion()          which pool nodes the draft should run next
//     if nodes is empty: break
//     draft forward over `nodes`; for each node, add_children(node, its top-k
//     tokens, their draft log-probs, their calibrated acceptance probabilities)
//   select()                            the tree to verify
//
// The POOL is every node known so far: the root and all children handed to
// add_children (pool index = order of arrival, so parents precede children).
// Nodes ordered by path probability (ties: pool index) form a max-heap
// order in which every prefix is a valid tree, because a child's path
// probability never exceeds its parent's. select() returns the prefix that
// maximises G / T; since T depends on n only through verify_s, that prefix is
// the best tree of any size the pool can build.
//
// next_expansion() decides whether another draft forward pays for itself. It
// considers the unexpanded nodes among the first max_nodes of the pool (in
// path probability order) and, for each count f of them, predicts the children a
// forward over the first f would add (node path probability x the expected
// acceptance of a rank-r child at that depth, from `child_accept`), charges
// draft_s(f), and re-optimises the prefix over pool + predicted children. It
// expands the f with the best predicted G / T if that beats the current G / T.
//
// hidden_draft_s is the drafting a streamed target's prefetch ring hides:
// while the draft runs, the reader fills the ring's free slots with the next
// pass's extents, so that pass stalls that much less (lever.cost.cost_model,
// CostModel.hidden_draft_curve). It depends on the pass: a pass over n tokens that
// waits on flash gains from reads done ahead, a compute-bound one does not; so
// it is one value per n (entry n-1; the last entry holds for larger n). Empty
// or 0 (the default) charges every draft second.
//
// Units: seconds for costs; probabilities in [0, 1] (values outside are
// clamped). Errors (bad arguments, a node that was not asked to be expanded)
// throw std::invalid_argument.
#pragma once

#include <cstdint>
#include <vector>

#include "tree/token_tree.h"

namespace lever {

// What an iteration costs; see the top of the file.
struct GrowCosts {
  std::vector<double> verify_s;  // [n-1]: one target pass over n tree tokens, n = 1..size()
  std::vector<double> draft_s;   // [f-1]: one draft forward over f nodes, f = 1..size()
  double overhead_s = 0.0;       // fixed host seconds per iteration
  std::vector<double> hidden_draft_s;  // [n-1]: draft seconds hidden under the reads before a pass of n
};

// The tree select() chose.
struct GrownTree {
  TokenTree tree;               // verification tree (root first, parents before children)
  std::vector<int> pool_index;  // pool index of each tree node
  double expected_tokens = 1.0; // G: 1 + sum of the nodes' path probabilities
  double predicted_s = 0.0;     // T: charged draft + verify_s(n) + overhead_s
};

class TreeGrower {
 public:
  // max_nodes: draft nodes per tree at most (root excluded; also capped by
  // verify_s.size() - 1). max_depth: deepest draft node. Throws
  // std::invalid_argument for empty or negative costs or limits < 0.
  TreeGrower(GrowCosts costs, int max_nodes, int max_depth);

  // Starts a tree at `root_token`. child_accept[d-1][r] is the expected
  // acceptance of a node's rank-r child at depth d (used only to predict what
  // an expansion will add); depths past the table use its last row.
  // root_extra_s: seconds added to the draft forward that expands the root
  // (the draft catching up on committed tokens it has not seen, in the same
  // batch); when even one expansion does not pay, none is made and the
  // iteration is plain target decoding.
  void begin(int32_t root_token, std::vector<std::vector<double>> child_accept, double root_extra_s = 0.0);

  // The draft's top children of `node`, in rank order (rank 0 = most likely):
  // tokens, draft log-probs and calibrated acceptance probabilities
  // P(child accepted | node accepted). `node` must be one returned by the last
  // next_expansion() and not fed yet. Children beyond max_depth are ignored.
  void add_children(int node, const int32_t* tokens, const float* logprobs,
                    const double* accept, int k);

  // The nodes to run through the draft next (path-probability order), or an
  // empty list when no further expansion is predicted to raise G / T. The
  // predicted draft cost of the returned nodes is charged at once.
  std::vector<int> next_expansion();

  // The best tree from the pool (see the top of the file).
  GrownTree select() const;

  const TokenTree& pool() const { return pool_; }
  double path_prob(int node) const;      // calibrated path probability (root: 1)
  int rank(int node) const;              // rank among its draft siblings (root: 0)
  double draft_spent_s() const { return draft_spent_; }
  int expansions() const { return expansions_; }
  const GrowCosts& costs() const { return costs_; }

 private:
  struct Best {
    int k = 0;           // draft nodes in the best prefix
    double ratio = 0.0;  // G / T of that prefix
  };
  // Best prefix of `probs` (descending) given `draft_s` seconds of drafting.
  Best best_prefix(const std::vector<double>& probs, double draft_s) const;
  double expected_child(int depth, int r) const;
  // Draft seconds charged for `spent` seconds of drafting before a pass over
  // k + 1 tokens (k draft nodes): max(0, spent - hidden_draft_s(k + 1)).
  double charged_draft(double spent, int k) const;
  // T of a tree of k draft nodes after `spent` seconds of drafting.
  double iteration_s(double spent, int k) const;
  // Best G / T over prefixes of the merge of two descending lists.
  double best_merged_ratio(const std::vector<double>& a, const std::vector<double>& b, double spent) const;

  GrowCosts costs_;
  int max_nodes_;
  int max_depth_;

  TokenTree pool_{0};
  std::vector<double> path_prob_;
  std::vector<int> rank_;
  std::vector<char> expanded_;      // ran through the draft (or was asked to)
  std::vector<char> awaiting_;      // asked to expand, children not fed yet
  std::vector<int> order_;          // draft nodes (no root), by path prob desc, index asc
  std::vector<double> order_probs_; // path probs in order_ order
  std::vector<std::vector<double>> child_accept_;
  double draft_spent_ = 0.0;
  double root_extra_s_ = 0.0;
  int expansions_ = 0;
};

}  // namespace lever
