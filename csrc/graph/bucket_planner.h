// BucketPlanner: packs a token tree into a compiled fixed-shape NPU graph.
//
// An NPU graph (QNN context binary) is compiled for static shapes, so Lever
// compiles a small set of "buckets" and pads every verification pass up to
// one of them. Units: rows = tokens (one row per tree node, one KV row per
// token); a bucket is (rows N, context C):
//
//   - N new rows: the tokens this pass runs (ids [N], positions [N]);
//   - C past rows: KV cache rows the graph reads (columns 0..C-1 of the mask);
//   - the graph's attention mask is float32 [N, C + N], ADDITIVE: 0.0 where a
//     row may attend, kMaskedLogit (-1e4) elsewhere. Columns 0..C-1 are the
//     past, columns C..C+N-1 the new rows themselves.
//
// Choosing a bucket: the smallest row bucket >= the rows to run and the
// smallest context bucket >= the rows already in the cache ("past").
//
// Chunks: a tree larger than the largest row bucket runs as consecutive
// chunks of at most max_rows() rows, in index order (a topological order, so
// every node's ancestors run in its chunk or an earlier one). Chunk c covers
// tree rows [start, end); when it runs the cache holds past + start rows
// (the committed past, then the earlier chunks' rows), so its own past is
// P = past + start.
//
// Packing one chunk (n = end - start real rows, P = past + start), from the
// tree's inputs tokens [T], positions [T] and bool mask [T, past + T]
// (true = may attend; lever.tree's mask(past)):
//
//   ids[i], positions[i]      = tokens[start + i], positions[start + i]   (i < n)
//                             = 0, 0                                        (padding, i >= n)
//   mask[i, j],     j < P     = 0 if tree mask[start + i, j] else MASKED    (real row, past)
//   mask[i, j], P <= j < C    = MASKED                                      (padding of the past)
//   mask[i, C + k], k < n     = 0 if tree mask[start + i, P + k] else MASKED
//   mask[i, C + k], k >= n    = MASKED                   (padding rows are never attended)
//   padding row i >= n        = MASKED except its own column C + i = 0  (no all-masked row)
//
// A real row may not attend a tree row of a later chunk (or a column beyond
// the tree): tree mask[start + i, P + n:] must be all false.
//
// Errors: bad arguments throw std::invalid_argument with one clear line.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace lever {

// The additive mask value of a column a row may not attend (large negative,
// finite, so fp16 graphs do not produce inf - inf).
constexpr float kMaskedLogit = -1e4f;

// One chunk of a tree: tree rows [start, end) run in bucket (rows, context).
struct BucketChunk {
  int64_t start = 0;
  int64_t end = 0;
  int64_t rows = 0;     // row bucket N >= end - start
  int64_t context = 0;  // context bucket C >= past + start
};

// The whole tree's verification inputs (T = n_tokens rows), read by pack().
struct PackSource {
  const int64_t* tokens = nullptr;     // [n_tokens] vocabulary ids
  int64_t n_tokens = 0;                // T
  const int64_t* positions = nullptr;  // [n_positions] token positions
  int64_t n_positions = 0;             // must be T
  const bool* mask = nullptr;          // [mask_rows, mask_cols] row-major, true = may attend
  int64_t mask_rows = 0;               // must be T
  int64_t mask_cols = 0;               // must be past + T
};

// One graph call's inputs, written by pack().
struct PackTarget {
  int64_t* ids = nullptr;        // [n_ids], must be rows_bucket
  int64_t n_ids = 0;
  int64_t* positions = nullptr;  // [n_positions], must be rows_bucket
  int64_t n_positions = 0;
  float* mask = nullptr;         // [mask_rows, mask_cols] row-major, additive
  int64_t mask_rows = 0;         // must be rows_bucket
  int64_t mask_cols = 0;         // must be context_bucket + rows_bucket
};

class BucketPlanner {
 public:
  // rows: the row buckets (N), contexts: the context buckets (C). Each list
  // is sorted and de-duplicated; throws std::invalid_argument if a list is
  // empty or holds a value < 1.
  BucketPlanner(std::vector<int64_t> rows, std::vector<int64_t> contexts);

  const std::vector<int64_t>& rows() const { return rows_; }          // ascending
  const std::vector<int64_t>& contexts() const { return contexts_; }  // ascending
  int64_t max_rows() const { return rows_.back(); }
  int64_t max_context() const { return contexts_.back(); }

  // (rows bucket, context bucket) for running n_rows rows with `past` rows in
  // the cache: the smallest row bucket >= n_rows and the smallest context
  // bucket >= past. Throws if n_rows < 1, past < 0, n_rows > max_rows() or
  // past > max_context().
  std::pair<int64_t, int64_t> choose(int64_t n_rows, int64_t past) const;

  // Rows [0, n_rows) split into consecutive chunks of at most max_rows() rows,
  // chunk c with past + start rows of past (see top of file), each with
  // choose(end - start, past + start). Throws if n_rows < 1, past < 0, or a
  // chunk's past exceeds max_context().
  std::vector<BucketChunk> chunks(int64_t n_rows, int64_t past) const;

  // Writes the graph inputs of tree rows [start, end) into dst (see top of
  // file): ids and positions [rows_bucket], additive mask
  // [rows_bucket, context_bucket + rows_bucket]. `past`: cached rows before the
  // tree. Throws std::invalid_argument (nothing written) for shape mismatches,
  // start < 0, start >= end, end > T, past < 0, end - start > rows_bucket,
  // past + start > context_bucket, or a real row that attends a column at or
  // beyond past + end. The buckets need not be this planner's.
  void pack(const PackSource& src, int64_t past, int64_t start, int64_t end, int64_t rows_bucket,
            int64_t context_bucket, const PackTarget& dst) const;

 private:
  std::vector<int64_t> rows_;
  std::vector<int64_t> contexts_;
};

}  // namespace lever
