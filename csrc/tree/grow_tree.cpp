#include "tree/grow_tree.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace lever {

namespace {

std::string str(long long v) { return std::to_string(v); }

double clamp01(double p) {
  if (!(p > 0.0)) return 0.0;  // also NaN
  return p < 1.0 ? p : 1.0;
}

// Inserts p into `desc` (sorted descending) after any equal values.
void insert_desc(std::vector<double>& desc, double p) {
  desc.insert(std::upper_bound(desc.begin(), desc.end(), p, std::greater<double>()), p);
}

}  // namespace

TreeGrower::TreeGrower(GrowCosts costs, int max_nodes, int max_depth)
    : costs_(std::move(costs)), max_nodes_(max_nodes), max_depth_(max_depth) {
  if (costs_.verify_s.empty()) throw std::invalid_argument("TreeGrower: verify_s is empty");
  if (costs_.draft_s.empty()) throw std::invalid_argument("TreeGrower: draft_s is empty");
  for (size_t i = 0; i < costs_.verify_s.size(); ++i) {
    if (!(costs_.verify_s[i] > 0.0) || !std::isfinite(costs_.verify_s[i])) {
      throw std::invalid_argument("TreeGrower: verify_s[" + str(static_cast<long long>(i)) +
                                  "] must be a positive number of seconds");
    }
  }
  for (size_t i = 0; i < costs_.draft_s.size(); ++i) {
    if (!(costs_.draft_s[i] >= 0.0) || !std::isfinite(costs_.draft_s[i])) {
      throw std::invalid_argument("TreeGrower: draft_s[" + str(static_cast<long long>(i)) +
                                  "] must be a non-negative number of seconds");
    }
  }
  if (!(costs_.overhead_s >= 0.0) || !std::isfinite(costs_.overhead_s)) {
    throw std::invalid_argument("TreeGrower: overhead_s must be >= 0");
  }
  for (double h : costs_.hidden_draft_s) {
    if (!(h >= 0.0) || !std::isfinite(h)) {
      throw std::invalid_argument("TreeGrower: hidden_draft_s must be non-negative numbers of seconds");
    }
  }
  if (max_nodes < 0 || max_depth < 0) {
    throw std::invalid_argument("TreeGrower: max_nodes and max_depth must be >= 0");
  }
  max_nodes_ = std::min(max_nodes_, static_cast<int>(costs_.verify_s.size()) - 1);
}

void TreeGrower::begin(int32_t root_token, std::vector<std::vector<double>> child_accept,
                       double root_extra_s) {
  if (!(root_extra_s >= 0.0) || !std::isfinite(root_extra_s)) {
    throw std::invalid_argument("begin: root_extra_s must be a non-negative number of seconds");
  }
  root_extra_s_ = root_extra_s;
  pool_ = TokenTree(root_token, 4 * max_nodes_ + 8);
  path_prob_.assign(1, 1.0);
  rank_.assign(1, 0);
  expanded_.assign(1, 0);
  awaiting_.assign(1, 0);
  order_.clear();
  order_probs_.clear();
  child_accept_ = std::move(child_accept);
  for (auto& row : child_accept_) {
    for (double& p : row) p = clamp01(p);
  }
  draft_spent_ = 0.0;
  expansions_ = 0;
}

double TreeGrower::path_prob(int node) const {
  if (node < 0 || node >= pool_.size()) {
    throw std::out_of_range("node " + str(node) + " is out of range (the pool has " +
                            str(pool_.size()) + " nodes)");
  }
  return path_prob_[static_cast<size_t>(node)];
}

int TreeGrower::rank(int node) const {
  path_prob(node);  // range check
  return rank_[static_cast<size_t>(node)];
}

double TreeGrower::expected_child(int depth, int r) const {
  if (child_accept_.empty() || depth < 1) return 0.0;
  const auto& row = child_accept_[std::min(static_cast<size_t>(depth - 1), child_accept_.size() - 1)];
  return static_cast<size_t>(r) < row.size() ? row[static_cast<size_t>(r)] : 0.0;
}

void TreeGrower::add_children(int node, const int32_t* tokens, const float* logprobs,
                              const double* accept, int k) {
  if (node < 0 || node >= pool_.size() || !awaiting_[static_cast<size_t>(node)]) {
    throw std::invalid_argument("add_children: node " + str(node) +
                                " was not returned by the last next_expansion() (or was already fed)");
  }
  if (k < 0) throw std::invalid_argument("add_children: k must be >= 0");
  awaiting_[static_cast<size_t>(node)] = 0;
  if (pool_.depth(node) + 1 > max_depth_) return;
  const double base = path_prob_[static_cast<size_t>(node)];
  for (int r = 0; r < k; ++r) {
    const double p = base * clamp01(accept[r]);
    if (p <= 0.0) continue;  // can never raise the expected length
    const int child = pool_.add(node, tokens[r], logprobs[r]);
    path_prob_.push_back(p);
    rank_.push_back(r);
    expanded_.push_back(0);
    awaiting_.push_back(0);
    // Descending by probability; equal probabilities keep pool order, so a
    // parent (smaller index, probability >= its child's) always comes first.
    const auto pos = std::upper_bound(order_probs_.begin(), order_probs_.end(), p,
                                      std::greater<double>());
    const auto at = pos - order_probs_.begin();
    order_probs_.insert(pos, p);
    order_.insert(order_.begin() + at, child);
  }
}

double TreeGrower::charged_draft(double spent, int k) const {
  const auto& hidden = costs_.hidden_draft_s;
  if (hidden.empty()) return spent;
  const double h = hidden[std::min(static_cast<size_t>(k), hidden.size() - 1)];
  // With no credit the sum is used as is (bit for bit the uncredited cost).
  return h == 0.0 ? spent : std::max(0.0, spent - h);
}

double TreeGrower::iteration_s(double spent, int k) const {
  return charged_draft(spent, k) + costs_.overhead_s + costs_.verify_s[static_cast<size_t>(k)];
}

TreeGrower::Best TreeGrower::best_prefix(const std::vector<double>& probs, double draft_s) const {
  // The same walk as best_merged_ratio with an empty second list.
  Best best{0, 1.0 / iteration_s(draft_s, 0)};
  const int kmax = std::min(static_cast<int>(probs.size()), max_nodes_);
  double gain = 1.0;
  for (int k = 1; k <= kmax; ++k) {
    gain += probs[static_cast<size_t>(k - 1)];
    const double ratio = gain / iteration_s(draft_s, k);
    if (ratio > best.ratio) best = {k, ratio};
  }
  return best;
}

double TreeGrower::best_merged_ratio(const std::vector<double>& a, const std::vector<double>& b,
                                     double spent) const {
  double best = 1.0 / iteration_s(spent, 0);
  double gain = 1.0;
  size_t i = 0, j = 0;
  const int n = std::min<int>(max_nodes_, static_cast<int>(a.size() + b.size()));
  for (int k = 1; k <= n; ++k) {
    if (j >= b.size() || (i < a.size() && a[i] >= b[j])) {
      gain += a[i++];
    } else {
      gain += b[j++];
    }
    best = std::max(best, gain / iteration_s(spent, k));
  }
  return best;
}

std::vector<int> TreeGrower::next_expansion() {
  for (size_t i = 0; i < awaiting_.size(); ++i) {
    if (awaiting_[i]) {
      throw std::invalid_argument("next_expansion: the children of node " +
                                  str(static_cast<long long>(i)) + " were not fed (add_children)");
    }
  }
  const Best current = best_prefix(order_probs_, draft_spent_);
  // Expansion candidates: unexpanded nodes that can be in a tree (the first
  // max_nodes by path probability), most likely first. Nodes just past the
  // current best tree count too: with their predicted children they may pay.
  std::vector<int> candidates;
  if (!expanded_[0] && max_depth_ >= 1) candidates.push_back(0);
  const int reach = std::min(static_cast<int>(order_.size()), max_nodes_);
  for (int i = 0; i < reach; ++i) {
    const int node = order_[static_cast<size_t>(i)];
    if (!expanded_[static_cast<size_t>(node)] && pool_.depth(node) < max_depth_) {
      candidates.push_back(node);
    }
  }
  const int fmax = std::min(static_cast<int>(candidates.size()), static_cast<int>(costs_.draft_s.size()));
  // Expanding the root (always the first candidate while unexpanded) costs extra.
  const double extra = expanded_[0] ? 0.0 : root_extra_s_;
  std::vector<double> predicted;  // descending
  int best_f = 0;
  double best_ratio = current.ratio;
  for (int f = 1; f <= fmax; ++f) {
    const int node = candidates[static_cast<size_t>(f - 1)];
    const int depth = pool_.depth(node) + 1;
    const double base = path_prob_[static_cast<size_t>(node)];
    const size_t width = child_accept_.empty()
        ? 0 : child_accept_[std::min(static_cast<size_t>(depth - 1), child_accept_.size() - 1)].size();
    for (size_t r = 0; r < width; ++r) {
      const double p = base * expected_child(depth, static_cast<int>(r));
      if (p > 0.0) insert_desc(predicted, p);
    }
    const double spent = draft_spent_ + extra + costs_.draft_s[static_cast<size_t>(f - 1)];
    const double ratio = best_merged_ratio(order_probs_, predicted, spent);
    if (ratio > best_ratio * (1.0 + 1e-12)) {
      best_ratio = ratio;
      best_f = f;
    }
  }
  std::vector<int> chosen(candidates.begin(), candidates.begin() + best_f);
  for (int node : chosen) {
    expanded_[static_cast<size_t>(node)] = 1;
    awaiting_[static_cast<size_t>(node)] = 1;
  }
  if (best_f > 0) {
    draft_spent_ += extra + costs_.draft_s[static_cast<size_t>(best_f - 1)];
    ++expansions_;
  }
  return chosen;
}

GrownTree TreeGrower::select() const {
  const Best best = best_prefix(order_probs_, draft_spent_);
  GrownTree out{TokenTree(pool_.token(0), best.k + 1), {0}, 1.0, 0.0};
  std::vector<int> tree_index(static_cast<size_t>(pool_.size()), -1);
  tree_index[0] = 0;
  for (int i = 0; i < best.k; ++i) {
    const int node = order_[static_cast<size_t>(i)];
    const int parent = tree_index[static_cast<size_t>(pool_.parent(node))];
    if (parent < 0) throw std::logic_error("TreeGrower::select: a node precedes its parent");
    tree_index[static_cast<size_t>(node)] = out.tree.add(parent, pool_.token(node), pool_.logprob(node));
    out.pool_index.push_back(node);
    out.expected_tokens += order_probs_[static_cast<size_t>(i)];
  }
  out.predicted_s = iteration_s(draft_spent_, best.k);
  return out;
}

}  // namespace lever
