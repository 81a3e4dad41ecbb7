// Native tests of the token tree (tree/token_tree.h) and the gain-cost tree
// grower (tree/grow_tree.h).
#include <stdexcept>
#include <vector>

#include "native_test.h"
#include "tree/grow_tree.h"
#include "tree/token_tree.h"

using lever::TokenTree;

using lever_test::throws_invalid;

namespace {

// root(5) -> a(1) -> c(3)
//         -> b(2) -> d(4)
//                 -> e(6)
TokenTree sample_tree() {
  return TokenTree::from_arrays(std::vector<int32_t>{5, 1, 2, 3, 4, 6},
                                std::vector<int32_t>{-1, 0, 0, 1, 2, 2},
                                std::vector<float>{0, -0.5f, -1.0f, -0.25f, -2.0f, -3.0f});
}

}  // namespace

TEST(token_tree_structure) {
  TokenTree t = sample_tree();
  CHECK_EQ(t.size(), 6);
  CHECK_EQ(t.parent(0), -1);
  CHECK_EQ(t.depth(3), 2);
  CHECK_EQ(t.max_depth(), 2);
  CHECK(t.children(2) == (std::vector<int>{4, 5}));
  CHECK_EQ(t.child_with_token(2, 6), 5);
  CHECK_EQ(t.child_with_token(2, 7), -1);
  CHECK(t.path(4) == (std::vector<int>{0, 2, 4}));
  CHECK(t.leaves() == (std::vector<int>{3, 4, 5}));
  CHECK(t.nodes_at_depth(1) == (std::vector<int>{1, 2}));
  CHECK(t.is_ancestor(2, 5));
  CHECK(t.is_ancestor(5, 5));
  CHECK(!t.is_ancestor(1, 5));
  CHECK_NEAR(t.path_logprob(3), -0.75f, 0.0f);
  CHECK_EQ(t.logprob(0), 0.0f);
}

TEST(token_tree_rejects_bad_input) {
  CHECK(throws_invalid([] {
    TokenTree::from_arrays(std::vector<int32_t>{1, 2}, std::vector<int32_t>{-1, 1});
  }));
  CHECK(throws_invalid([] {  // duplicate sibling tokens
    TokenTree::from_arrays(std::vector<int32_t>{1, 2, 2}, std::vector<int32_t>{-1, 0, 0});
  }));
  TokenTree t(3);
  CHECK(throws_invalid([&] { t.add(5, 1); }));
  CHECK(throws_invalid([&] { t.add(0, -1); }));
  t.add(0, 4);
  CHECK(throws_invalid([&] { t.add(0, 4); }));
  bool out_of_range = false;
  try {
    t.token(9);
  } catch (const std::out_of_range&) {
    out_of_range = true;
  }
  CHECK(out_of_range);
}

TEST(token_tree_mask_and_positions) {
  TokenTree t = sample_tree();
  const int64_t n_cached = 3;
  const int64_t w = t.mask_width(n_cached);
  CHECK_EQ(w, 9);
  std::vector<char> mask(static_cast<size_t>(t.size() * w));
  t.fill_mask(n_cached, reinterpret_cast<bool*>(mask.data()));
  for (int i = 0; i < t.size(); ++i) {
    for (int64_t c = 0; c < n_cached; ++c) CHECK(mask[i * w + c]);
    for (int j = 0; j < t.size(); ++j)
      CHECK_MSG(static_cast<bool>(mask[i * w + n_cached + j]) == t.is_ancestor(j, i),
                "row " << i << " col " << j);
  }
  std::vector<int64_t> pos(t.size());
  t.fill_positions(n_cached, pos.data());
  CHECK(pos == (std::vector<int64_t>{3, 4, 4, 5, 5, 5}));
}

TEST(token_tree_walk_and_compaction) {
  TokenTree t = sample_tree();
  // Target says: after root -> 2 (node b), after b -> 6 (node e), after e -> 9.
  std::vector<int32_t> target = {2, 0, 6, 0, 0, 9};
  lever::WalkResult r = t.walk(target.data());
  CHECK(r.accepted == (std::vector<int>{2, 5}));
  CHECK_EQ(r.next_token, 9);
  std::vector<int64_t> keep = t.compaction_indices(3, r.accepted);
  CHECK(keep == (std::vector<int64_t>{0, 1, 2, 3, 5, 8}));
  CHECK_EQ(TokenTree::compaction_size(3, 2), 6);
  CHECK(throws_invalid([&] { t.compaction_indices(3, {5}); }));  // not a path from the root
  std::vector<int32_t> bad = {-1, 0, 0, 0, 0, 0};
  CHECK(throws_invalid([&] { t.walk(bad.data()); }));
}

TEST(token_tree_prune) {
  TokenTree t = sample_tree();
  std::vector<bool> keep = {true, true, false, true, true, true};  // drop b and its subtree
  lever::PruneResult p = t.subtree_prune(keep);
  CHECK_EQ(p.tree.size(), 3);
  CHECK(p.tree.tokens() == (std::vector<int32_t>{5, 1, 3}));
  CHECK(p.old_to_new == (std::vector<int>{0, 1, -1, 2, -1, -1}));
}

TEST(grower_stops_when_drafting_does_not_pay) {
  // Verifying more tokens costs a lot, drafting is expensive: plain decoding.
  lever::GrowCosts costs;
  costs.verify_s = {0.01, 1.0, 2.0, 3.0};
  costs.draft_s = {1.0, 1.0, 1.0};
  lever::TreeGrower g(costs, 3, 3);
  g.begin(7, {{0.1, 0.05}});
  CHECK(g.next_expansion().empty());
  lever::GrownTree best = g.select();
  CHECK_EQ(best.tree.size(), 1);
  CHECK_EQ(best.expected_tokens, 1.0);
}

TEST(grower_grows_a_chain_when_acceptance_is_high) {
  // Verification is flat in n and drafting is nearly free: grow to the limit.
  const int max_nodes = 6;
  lever::GrowCosts costs;
  costs.verify_s.assign(max_nodes + 1, 0.02);
  costs.draft_s.assign(max_nodes, 1e-5);
  lever::TreeGrower g(costs, max_nodes, 4);
  g.begin(1, {{0.9, 0.05}});
  int rounds = 0;
  for (;;) {
    std::vector<int> nodes = g.next_expansion();
    if (nodes.empty() || ++rounds > 20) break;
    for (int node : nodes) {
      int32_t tokens[2] = {100 + node, 200 + node};
      float lps[2] = {-0.1f, -3.0f};
      double acc[2] = {0.9, 0.05};
      g.add_children(node, tokens, lps, acc, 2);
    }
  }
  CHECK(rounds >= 1 && rounds <= 20);
  lever::GrownTree best = g.select();
  CHECK(best.tree.size() > 1);
  CHECK(best.tree.size() <= max_nodes + 1);
  CHECK(best.tree.max_depth() <= 4);
  // G = 1 + sum of path probabilities of the selected draft nodes.
  double g_sum = 1.0;
  for (int i = 1; i < best.tree.size(); ++i) g_sum += g.path_prob(best.pool_index[i]);
  CHECK_NEAR(best.expected_tokens, g_sum, 1e-9);
  // The selected tree is a prefix in path-probability order: every parent is in it.
  for (int i = 1; i < best.tree.size(); ++i) CHECK(best.tree.parent(i) < i);
  CHECK(throws_invalid([&] {
    int32_t tok = 1;
    float lp = 0;
    double a = 0.5;
    g.add_children(0, &tok, &lp, &a, 1);  // not asked for
  }));
}
