// Static-shape bucket planning and packing (see bucket_planner.h).

#include "graph/bucket_planner.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace lever {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Sorts and de-duplicates a bucket list; throws if it is empty or holds a value < 1.
std::vector<int64_t> sorted_buckets(std::vector<int64_t> values, const char* what) {
  if (values.empty()) {
    throw std::invalid_argument(std::string("BucketPlanner: ") + what +
                                " buckets are empty; give at least one size");
  }
  for (int64_t v : values) {
    if (v < 1) {
      throw std::invalid_argument(std::string("BucketPlanner: ") + what + " bucket " + str(v) +
                                  " must be >= 1");
    }
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

// The smallest value of an ascending list >= n (the caller checked n <= the last one).
int64_t smallest_at_least(const std::vector<int64_t>& ascending, int64_t n) {
  for (int64_t v : ascending) {
    if (v >= n) return v;
  }
  return ascending.back();
}

}  // namespace

BucketPlanner::BucketPlanner(std::vector<int64_t> rows, std::vector<int64_t> contexts)
    : rows_(sorted_buckets(std::move(rows), "row")),
      contexts_(sorted_buckets(std::move(contexts), "context")) {}

std::pair<int64_t, int64_t> BucketPlanner::choose(int64_t n_rows, int64_t past) const {
  if (n_rows < 1) {
    throw std::invalid_argument("choose: n_rows must be >= 1, got " + str(n_rows));
  }
  if (past < 0) {
    throw std::invalid_argument("choose: past must be >= 0, got " + str(past));
  }
  if (n_rows > max_rows()) {
    throw std::invalid_argument("choose: " + str(n_rows) + " rows exceed the largest row bucket (" +
                                str(max_rows()) + "); split them with chunks()");
  }
  if (past > max_context()) {
    throw std::invalid_argument("choose: " + str(past) +
                                " rows of past exceed the largest context bucket (" +
                                str(max_context()) + ")");
  }
  return {smallest_at_least(rows_, n_rows), smallest_at_least(contexts_, past)};
}

std::vector<BucketChunk> BucketPlanner::chunks(int64_t n_rows, int64_t past) const {
  if (n_rows < 1) {
    throw std::invalid_argument("chunks: n_rows must be >= 1, got " + str(n_rows));
  }
  if (past < 0) {
    throw std::invalid_argument("chunks: past must be >= 0, got " + str(past));
  }
  if (past > max_context()) {
    throw std::invalid_argument("chunks: " + str(past) +
                                " rows of past exceed the largest context bucket (" +
                                str(max_context()) + ")");
  }
  std::vector<BucketChunk> out;
  int64_t start = 0;
  while (start < n_rows) {
    // end = min(start + max_rows, n_rows), written so that it cannot overflow.
    const int64_t end = (n_rows - start > max_rows()) ? start + max_rows() : n_rows;
    // This chunk runs with past + start rows in the cache (past <= max_context here).
    if (start > max_context() - past) {
      throw std::invalid_argument(
          "chunks: chunk " + str(static_cast<int64_t>(out.size())) + " (rows [" + str(start) +
          ", " + str(end) + ") of " + str(n_rows) + ") would run with " + str(past) + " + " +
          str(start) + " rows of past, more than the largest context bucket (" +
          str(max_context()) + ")");
    }
    BucketChunk c;
    c.start = start;
    c.end = end;
    c.rows = smallest_at_least(rows_, end - start);
    c.context = smallest_at_least(contexts_, past + start);
    out.push_back(c);
    start = end;
  }
  return out;
}

void BucketPlanner::pack(const PackSource& src, int64_t past, int64_t start, int64_t end,
                         int64_t rows_bucket, int64_t context_bucket, const PackTarget& dst) const {
  // --- Checks (nothing is written unless all pass) -------------------------
  const int64_t T = src.n_tokens;
  if (past < 0) throw std::invalid_argument("pack: past must be >= 0, got " + str(past));
  if (start < 0 || start >= end || end > T) {
    throw std::invalid_argument("pack: rows [" + str(start) + ", " + str(end) +
                                ") must be a non-empty range within the tree's " + str(T) +
                                " rows");
  }
  if (src.n_positions != T) {
    throw std::invalid_argument("pack: positions has " + str(src.n_positions) +
                                " entries, expected " + str(T) + " (one per token)");
  }
  if (src.mask_rows != T || src.mask_cols < T || src.mask_cols - T != past) {
    throw std::invalid_argument("pack: mask has shape (" + str(src.mask_rows) + ", " +
                                str(src.mask_cols) + "), expected (" + str(T) + ", past + " +
                                str(T) + ") with past = " + str(past));
  }
  if (rows_bucket < 1 || context_bucket < 0) {
    throw std::invalid_argument("pack: rows_bucket must be >= 1 and context_bucket >= 0, got " +
                                str(rows_bucket) + " and " + str(context_bucket));
  }
  const int64_t n = end - start;  // real rows
  const int64_t P = past + start;  // rows in the cache when this chunk runs (<= mask_cols)
  const int64_t N = rows_bucket;
  const int64_t C = context_bucket;
  if (n > N) {
    throw std::invalid_argument("pack: " + str(n) + " rows do not fit the row bucket " + str(N));
  }
  if (P > C) {
    throw std::invalid_argument("pack: " + str(P) + " rows of past (" + str(past) + " + start " +
                                str(start) + ") do not fit the context bucket " + str(C));
  }
  if (dst.n_ids != N) {
    throw std::invalid_argument("pack: ids_out has " + str(dst.n_ids) + " entries, expected " +
                                str(N) + " (rows_bucket)");
  }
  if (dst.n_positions != N) {
    throw std::invalid_argument("pack: positions_out has " + str(dst.n_positions) +
                                " entries, expected " + str(N) + " (rows_bucket)");
  }
  if (dst.mask_rows != N || dst.mask_cols < N || dst.mask_cols - N != C) {
    throw std::invalid_argument("pack: mask_out has shape (" + str(dst.mask_rows) + ", " +
                                str(dst.mask_cols) + "), expected (" + str(N) + ", " + str(C) +
                                " + " + str(N) + ")");
  }
  const int64_t W = src.mask_cols;  // = past + T
  for (int64_t i = 0; i < n; ++i) {
    const bool* row = src.mask + (start + i) * W;
    for (int64_t j = P + n; j < W; ++j) {
      if (row[j]) {
        throw std::invalid_argument(
            "pack: tree row " + str(start + i) + " attends column " + str(j) + " (tree row " +
            str(j - past) + "), which is not in this chunk (rows [" + str(start) + ", " +
            str(end) + ")) or an earlier one");
      }
    }
  }

  // --- Tokens and positions: the real rows, then zeros ----------------------
  for (int64_t i = 0; i < N; ++i) {
    dst.ids[i] = i < n ? src.tokens[start + i] : 0;
    dst.positions[i] = i < n ? src.positions[start + i] : 0;
  }

  // --- Additive mask [N, C + N] ------------------------------------------
  const int64_t WO = C + N;
  for (int64_t i = 0; i < N; ++i) {
    float* out = dst.mask + i * WO;
    for (int64_t j = 0; j < WO; ++j) out[j] = kMaskedLogit;
    if (i >= n) {
      out[C + i] = 0.0f;  // a padding row attends only itself
      continue;
    }
    const bool* row = src.mask + (start + i) * W;
    for (int64_t j = 0; j < P; ++j) {  // the past: committed rows and earlier chunks
      if (row[j]) out[j] = 0.0f;
    }
    for (int64_t k = 0; k < n; ++k) {  // this chunk's rows
      if (row[P + k]) out[C + k] = 0.0f;
    }
  }
}

}  // namespace lever
