// Native tests of the static-shape bucket planner (graph/bucket_planner.h):
//  - bucket_planner_sorts_and_dedupes, bucket_planner_choose: bucket lists and choice;
//  - bucket_planner_chunks_*: splitting (a 300-row tree with 128-row buckets), the
//    past of each chunk;
//  - bucket_planner_pack_*: ids/positions padding and every region of the additive
//    mask against a plain reference written here, and a 300-row random tree packed
//    chunk by chunk whose masks together give back the tree's mask;
//  - bucket_planner_*_errors: every std::invalid_argument, and that a failed pack
//    writes nothing.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/bucket_planner.h"
#include "native_test.h"
#include "tree/token_tree.h"

using lever::BucketChunk;
using lever::BucketPlanner;
using lever::kMaskedLogit;
using lever::PackSource;
using lever::PackTarget;
using lever::TokenTree;

namespace {

// The message of the std::invalid_argument f() throws, or "" if it throws none.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

BucketPlanner default_planner() {
  return BucketPlanner({1, 8, 16, 32, 64, 128}, {128, 256, 512, 1024, 2048});
}

// A random tree of n nodes (each node's parent drawn from the earlier ones,
// tokens distinct so siblings never clash).
TokenTree random_tree(lever_test::Rng& rng, int n) {
  std::vector<int32_t> tokens(n), parents(n);
  for (int i = 0; i < n; ++i) {
    tokens[i] = 1000 + i;
    parents[i] = i == 0 ? -1 : static_cast<int32_t>(rng.next_u32() % static_cast<uint32_t>(i));
  }
  return TokenTree::from_arrays(tokens, parents);
}

// The tree's verification inputs with `past` cached rows, as pack() reads them.
struct TreeInputs {
  std::vector<int64_t> tokens, positions;
  std::vector<char> mask;  // bool [T, past + T] (char: std::vector<bool> has no data())
  int64_t T = 0, past = 0;

  TreeInputs(const TokenTree& tree, int64_t past_rows) : T(tree.size()), past(past_rows) {
    tokens.assign(tree.tokens().begin(), tree.tokens().end());
    positions.resize(static_cast<size_t>(T));
    tree.fill_positions(past, positions.data());
    mask.resize(static_cast<size_t>(T * (past + T)));
    tree.fill_mask(past, reinterpret_cast<bool*>(mask.data()));
  }
  bool at(int64_t r, int64_t c) const { return mask[static_cast<size_t>(r * (past + T) + c)] != 0; }
  PackSource source() const {
    PackSource s;
    s.tokens = tokens.data();
    s.n_tokens = T;
    s.positions = positions.data();
    s.n_positions = T;
    s.mask = reinterpret_cast<const bool*>(mask.data());
    s.mask_rows = T;
    s.mask_cols = past + T;
    return s;
  }
};

// One graph call's buffers, pre-filled with a sentinel so untouched entries show.
struct GraphInputs {
  std::vector<int64_t> ids, positions;
  std::vector<float> mask;
  int64_t N, C;

  GraphInputs(int64_t rows, int64_t context)
      : ids(static_cast<size_t>(rows), -7), positions(static_cast<size_t>(rows), -7),
        mask(static_cast<size_t>(rows * (context + rows)), 123.0f), N(rows), C(context) {}
  float at(int64_t i, int64_t j) const { return mask[static_cast<size_t>(i * (C + N) + j)]; }
  PackTarget target() {
    PackTarget t;
    t.ids = ids.data();
    t.n_ids = N;
    t.positions = positions.data();
    t.n_positions = N;
    t.mask = mask.data();
    t.mask_rows = N;
    t.mask_cols = C + N;
    return t;
  }
};

// The packing rules of bucket_planner.h, entry by entry.
float expected_mask(const TreeInputs& in, int64_t start, int64_t end, int64_t C, int64_t i,
                    int64_t j) {
  const int64_t n = end - start, P = in.past + start;
  if (i >= n) return j == C + i ? 0.0f : kMaskedLogit;  // padding row: only itself
  if (j < P) return in.at(start + i, j) ? 0.0f : kMaskedLogit;
  if (j < C) return kMaskedLogit;  // padding of the past
  const int64_t k = j - C;
  if (k < n) return in.at(start + i, P + k) ? 0.0f : kMaskedLogit;
  return kMaskedLogit;  // padding rows are never attended
}

// Packs chunk [start, end) into (N, C) and checks every output entry against the rules.
void check_pack(const BucketPlanner& planner, const TreeInputs& in, int64_t start, int64_t end,
                int64_t N, int64_t C) {
  GraphInputs g(N, C);
  planner.pack(in.source(), in.past, start, end, N, C, g.target());
  const int64_t n = end - start;
  long bad = 0;
  for (int64_t i = 0; i < N; ++i) {
    CHECK_EQ(g.ids[i], i < n ? in.tokens[start + i] : 0);
    CHECK_EQ(g.positions[i], i < n ? in.positions[start + i] : 0);
    for (int64_t j = 0; j < C + N; ++j) {
      const float want = expected_mask(in, start, end, C, i, j);
      if (!lever_test::same_bits(g.at(i, j), want) && bad++ < 5) {
        CHECK_MSG(false, "chunk [" << start << ", " << end << ") N=" << N << " C=" << C
                                   << ": mask[" << i << ", " << j << "] = " << g.at(i, j)
                                   << ", want " << want);
      }
    }
  }
  CHECK_EQ(bad, 0);
}

}  // namespace

TEST(bucket_planner_sorts_and_dedupes) {
  BucketPlanner p({16, 1, 8, 8, 16}, {256, 128, 256});
  CHECK(p.rows() == (std::vector<int64_t>{1, 8, 16}));
  CHECK(p.contexts() == (std::vector<int64_t>{128, 256}));
  CHECK_EQ(p.max_rows(), 16);
  CHECK_EQ(p.max_context(), 256);
  CHECK_EQ(kMaskedLogit, -1e4f);
}

TEST(bucket_planner_choose) {
  const BucketPlanner p = default_planner();
  CHECK(p.choose(1, 0) == std::make_pair(int64_t{1}, int64_t{128}));
  CHECK(p.choose(2, 128) == std::make_pair(int64_t{8}, int64_t{128}));
  CHECK(p.choose(8, 129) == std::make_pair(int64_t{8}, int64_t{256}));
  CHECK(p.choose(9, 2047) == std::make_pair(int64_t{16}, int64_t{2048}));
  CHECK(p.choose(128, 2048) == std::make_pair(int64_t{128}, int64_t{2048}));
  CHECK(p.choose(65, 500) == std::make_pair(int64_t{128}, int64_t{512}));
}

TEST(bucket_planner_choose_errors) {
  const BucketPlanner p = default_planner();
  CHECK(contains(error_of([&] { p.choose(0, 0); }), "n_rows must be >= 1"));
  CHECK(contains(error_of([&] { p.choose(1, -1); }), "past must be >= 0"));
  CHECK(contains(error_of([&] { p.choose(129, 0); }), "largest row bucket (128)"));
  CHECK(contains(error_of([&] { p.choose(1, 2049); }), "largest context bucket (2048)"));
}

TEST(bucket_planner_constructor_errors) {
  CHECK(contains(error_of([] { BucketPlanner({}, {128}); }), "row buckets are empty"));
  CHECK(contains(error_of([] { BucketPlanner({1}, {}); }), "context buckets are empty"));
  CHECK(contains(error_of([] { BucketPlanner({0, 8}, {128}); }), "row bucket 0 must be >= 1"));
  CHECK(contains(error_of([] { BucketPlanner({8}, {128, -5}); }),
                 "context bucket -5 must be >= 1"));
}

TEST(bucket_planner_chunks_splits_300_rows) {
  const BucketPlanner p = default_planner();
  const std::vector<BucketChunk> c = p.chunks(300, 50);
  REQUIRE(c.size() == 3);
  // [0, 128) with 50 rows of past; [128, 256) with 50 + 128; [256, 300) with 50 + 256.
  const int64_t want[3][4] = {{0, 128, 128, 128}, {128, 256, 128, 256}, {256, 300, 64, 512}};
  for (int k = 0; k < 3; ++k) {
    CHECK_EQ(c[k].start, want[k][0]);
    CHECK_EQ(c[k].end, want[k][1]);
    CHECK_EQ(c[k].rows, want[k][2]);
    CHECK_EQ(c[k].context, want[k][3]);
    // Each chunk is choose(its rows, past + start).
    const auto nc = p.choose(c[k].end - c[k].start, 50 + c[k].start);
    CHECK_EQ(nc.first, c[k].rows);
    CHECK_EQ(nc.second, c[k].context);
  }
}

TEST(bucket_planner_chunks_small_and_exact) {
  const BucketPlanner p = default_planner();
  std::vector<BucketChunk> c = p.chunks(5, 0);
  REQUIRE(c.size() == 1);
  CHECK_EQ(c[0].start, 0);
  CHECK_EQ(c[0].end, 5);
  CHECK_EQ(c[0].rows, 8);
  CHECK_EQ(c[0].context, 128);
  c = p.chunks(256, 0);  // exactly two full chunks
  REQUIRE(c.size() == 2);
  CHECK_EQ(c[1].start, 128);
  CHECK_EQ(c[1].end, 256);
  CHECK_EQ(c[1].rows, 128);
  CHECK_EQ(c[1].context, 128);
  // Past right at the limit for the last chunk: 2048 - 128 + 128.
  c = p.chunks(129, 2048 - 128);
  REQUIRE(c.size() == 2);
  CHECK_EQ(c[1].rows, 1);
  CHECK_EQ(c[1].context, 2048);
  const BucketPlanner ones({1}, {4});
  c = ones.chunks(5, 0);  // one row at a time, past 0..4
  REQUIRE(c.size() == 5);
  for (int k = 0; k < 5; ++k) {
    CHECK_EQ(c[k].start, k);
    CHECK_EQ(c[k].end, k + 1);
    CHECK_EQ(c[k].context, 4);
  }
}

TEST(bucket_planner_chunks_errors) {
  const BucketPlanner p = default_planner();
  CHECK(contains(error_of([&] { p.chunks(0, 0); }), "n_rows must be >= 1"));
  CHECK(contains(error_of([&] { p.chunks(4, -1); }), "past must be >= 0"));
  CHECK(contains(error_of([&] { p.chunks(4, 2049); }), "largest context bucket (2048)"));
  // The second chunk would run with 2000 + 128 rows of past.
  const std::string e = error_of([&] { p.chunks(300, 2000); });
  CHECK_MSG(contains(e, "chunk 1 (rows [128, 256) of 300)"), e);
  CHECK(error_of([&] { p.chunks(129, 2048 - 128); }).empty());
  CHECK(!error_of([&] { p.chunks(129, 2048 - 127); }).empty());
}

TEST(bucket_planner_pack_regions) {
  // A hand-made 4-row tree (root, two children, a grandchild) with 3 cached rows.
  const TokenTree tree = TokenTree::from_arrays(std::vector<int32_t>{7, 8, 9, 10},
                                                std::vector<int32_t>{-1, 0, 0, 1});
  const TreeInputs in(tree, 3);
  const BucketPlanner p({8}, {16});
  GraphInputs g(8, 16);
  p.pack(in.source(), 3, 0, 4, 8, 16, g.target());
  CHECK(g.ids == (std::vector<int64_t>{7, 8, 9, 10, 0, 0, 0, 0}));
  CHECK(g.positions == (std::vector<int64_t>{3, 4, 4, 5, 0, 0, 0, 0}));
  const float M = kMaskedLogit;
  // Row 3 (node 3: ancestors 0, 1): past 0..2 attended, past padding 3..15 masked,
  // new columns 16 (node 0), 17 (node 1), 19 (itself); padding columns 20..23 masked.
  for (int j = 0; j < 3; ++j) CHECK_EQ(g.at(3, j), 0.0f);
  for (int j = 3; j < 16; ++j) CHECK_EQ(g.at(3, j), M);
  CHECK_EQ(g.at(3, 16), 0.0f);
  CHECK_EQ(g.at(3, 17), 0.0f);
  CHECK_EQ(g.at(3, 18), M);
  CHECK_EQ(g.at(3, 19), 0.0f);
  for (int j = 20; j < 24; ++j) CHECK_EQ(g.at(3, j), M);
  // Padding row 5: only its own column 16 + 5.
  for (int j = 0; j < 24; ++j) CHECK_EQ(g.at(5, j), j == 21 ? 0.0f : M);
  check_pack(p, in, 0, 4, 8, 16);
  check_pack(p, in, 1, 3, 2, 5);  // a middle chunk: past 3 + 1, exact fit of the context
  check_pack(p, in, 3, 4, 1, 6);  // the last row alone, no padding
}

TEST(bucket_planner_pack_300_row_tree_in_chunks) {
  lever_test::Rng rng(17);
  const BucketPlanner p({1, 8, 16, 32, 64, 128}, {128, 256, 512, 1024});
  for (int trial = 0; trial < 3; ++trial) {
    const TokenTree tree = random_tree(rng, 300);
    const int64_t past = trial * 40;
    const TreeInputs in(tree, past);
    const std::vector<BucketChunk> chunks = p.chunks(300, past);
    CHECK_EQ(chunks.size(), size_t{3});
    // Which absolute KV columns each tree row attends, rebuilt from the packed masks:
    // past column j < P is KV row j, new column C + k is KV row P + k.
    std::vector<char> seen(static_cast<size_t>(300 * (past + 300)), 0);
    for (const BucketChunk& c : chunks) {
      check_pack(p, in, c.start, c.end, c.rows, c.context);
      GraphInputs g(c.rows, c.context);
      p.pack(in.source(), past, c.start, c.end, c.rows, c.context, g.target());
      const int64_t P = past + c.start;
      for (int64_t i = 0; i < c.end - c.start; ++i) {
        for (int64_t j = 0; j < c.context + c.rows; ++j) {
          if (g.at(i, j) != 0.0f) continue;
          const int64_t kv = j < c.context ? j : P + (j - c.context);
          seen[static_cast<size_t>((c.start + i) * (past + 300) + kv)] = 1;
        }
      }
    }
    CHECK_MSG(seen == in.mask, "trial " << trial << ": chunked masks differ from the tree's mask");
  }
}

TEST(bucket_planner_pack_errors) {
  const TokenTree tree = TokenTree::from_arrays(std::vector<int32_t>{7, 8, 9, 10},
                                                std::vector<int32_t>{-1, 0, 0, 1});
  const TreeInputs in(tree, 3);
  const BucketPlanner p({8}, {16});
  GraphInputs g(8, 16);
  auto pack_with = [&](PackSource s, int64_t past, int64_t start, int64_t end, int64_t N, int64_t C,
                       PackTarget t) {
    return error_of([&] { p.pack(s, past, start, end, N, C, t); });
  };
  const PackSource s = in.source();
  const PackTarget t = g.target();
  CHECK(contains(pack_with(s, -1, 0, 4, 8, 16, t), "past must be >= 0"));
  CHECK(contains(pack_with(s, 3, -1, 4, 8, 16, t), "non-empty range"));
  CHECK(contains(pack_with(s, 3, 2, 2, 8, 16, t), "non-empty range"));
  CHECK(contains(pack_with(s, 3, 0, 5, 8, 16, t), "non-empty range"));
  PackSource bad = s;
  bad.n_positions = 3;
  CHECK(contains(pack_with(bad, 3, 0, 4, 8, 16, t), "positions has 3 entries"));
  bad = s;
  bad.mask_rows = 3;
  CHECK(contains(pack_with(bad, 3, 0, 4, 8, 16, t), "mask has shape (3, 7)"));
  CHECK(contains(pack_with(s, 2, 0, 4, 8, 16, t), "mask has shape (4, 7)"));  // past disagrees
  CHECK(contains(pack_with(s, 3, 0, 4, 0, 16, t), "rows_bucket must be >= 1"));
  CHECK(contains(pack_with(s, 3, 0, 4, 8, -1, t), "context_bucket >= 0"));
  CHECK(contains(pack_with(s, 3, 0, 4, 2, 16, t), "4 rows do not fit the row bucket 2"));
  CHECK(contains(pack_with(s, 3, 1, 4, 8, 3, t), "4 rows of past"));
  PackTarget bt = t;
  bt.n_ids = 7;
  CHECK(contains(pack_with(s, 3, 0, 4, 8, 16, bt), "ids_out has 7 entries"));
  bt = t;
  bt.n_positions = 9;
  CHECK(contains(pack_with(s, 3, 0, 4, 8, 16, bt), "positions_out has 9 entries"));
  bt = t;
  bt.mask_rows = 7;
  CHECK(contains(pack_with(s, 3, 0, 4, 8, 16, bt), "mask_out has shape (7, 24)"));
  CHECK(contains(pack_with(s, 3, 0, 4, 8, 15, t), "mask_out has shape (8, 24)"));  // C disagrees
  // Chunk [0, 2) of a tree whose row 1 attends row 3 (a later chunk): not a valid chunking.
  TreeInputs bad_in(tree, 3);
  bad_in.mask[static_cast<size_t>(1 * 7 + 3 + 3)] = 1;
  const std::string e = pack_with(bad_in.source(), 3, 0, 2, 8, 16, t);
  CHECK_MSG(contains(e, "tree row 1 attends column 6 (tree row 3)"), e);
  // ... and nothing was written by any failed call.
  for (int64_t v : g.ids) CHECK_EQ(v, -7);
  for (int64_t v : g.positions) CHECK_EQ(v, -7);
  for (float v : g.mask) CHECK_EQ(v, 123.0f);
  // Chunk [0, 4) of that tree is fine: the column is inside the chunk.
  CHECK(pack_with(bad_in.source(), 3, 0, 4, 8, 16, t).empty());
}
