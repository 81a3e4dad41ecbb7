// Early-exit probe scoring and pruning of a draft tree (issue 16).
//
// After decoder layer k of a verification pass, each tree node j (a draft
// token) is scored from its parent's hidden state: the "logit lens" value
//   lens[j] = dot(rms_norm(x[parent_row[j]]) * norm_w, head_row[token j])
// (the target's final norm and output head applied to an intermediate layer),
// plus draft-side features, combined by a logistic probe:
//   lens_margin[j] = lens[j] - max(lens[i] : i a sibling of j, j included)
//   logit[j] = w[0] + w[1] lens + w[2] lens_margin + w[3] draft_logp
//              + w[4] sibling_rank + w[5] depth
// Nodes whose logit falls below a threshold are dropped, with their subtrees
// (prune_closure), and the pass continues on the survivors.
//
// Units: H is the hidden size in elements; table bytes are ggml rows of H
// values (row_bytes(qtype, H) bytes each); lens and logit are in logit units.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lever {

// Features per node, the weights' length minus one.
constexpr size_t kProbeFeatures = 5;

// Scores n nodes (see above). x: x_rows rows of H floats (contiguous);
// parent_rows[j]: the row of x holding node j's parent; parents[j]: j's parent
// node id (nodes with equal parents are siblings); table: n rows of qtype
// bytes, row j the head row of node j's token; norm_w [H]: the final norm's
// weight; eps: added to the mean square; draft_logp, sibling_rank, depth [n];
// weights [kProbeFeatures + 1]. Writes lens_out [n] and logit_out [n].
// All fp32 except the final weighted sum (fp64, rounded once to fp32).
// Throws std::invalid_argument for a parent row out of range, an unsupported
// qtype, or a table that is not n rows of row_bytes(qtype, H) bytes.
void probe_scores(const float* x, size_t x_rows, size_t H, const int64_t* parent_rows,
                  const int64_t* parents, size_t n, const uint8_t* table, size_t table_bytes,
                  int qtype, const float* norm_w, float eps, const float* draft_logp,
                  const float* sibling_rank, const float* depth, const double* weights,
                  float* lens_out, float* logit_out);

// kept[j] = keep_self[j] and kept[parents[j]] for a tree in topological order
// (parents[0] == -1, 0 <= parents[j] < j otherwise); node 0 is always kept.
// Throws std::invalid_argument for parents that are not such a tree.
void prune_closure(const int64_t* parents, const uint8_t* keep_self, size_t n, uint8_t* kept);

}  // namespace lever
