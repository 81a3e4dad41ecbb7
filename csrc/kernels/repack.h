// Weights repacked for batched kernels: groups of 8 interleaved rows.
//
// A ggml matrix stores each row as consecutive blocks. The repacked ("R8")
// form keeps the bytes of each group of 8 consecutive rows together, block by
// block, with the fields of the 8 rows interleaved so that one 256-bit load
// holds 4 bytes of each of the 8 rows: SIMD lane r is weight row r. A kernel
// then broadcasts 4 activation bytes against the 8 rows at once, keeps one
// integer sum per (weight row, activation row) in a register lane, and applies
// each block's float scales lane-wise, in the scalar reference's order, so the
// results are bit-identical to the scalar kernels (qdot.h) whatever the number
// of activation rows, the tiling, the thread count or the instruction set.
//
// The repacked bytes are a pure permutation of the original ones (fp16 scales
// stay fp16, 6-bit scale fields stay packed): a matrix takes exactly the same
// number of bytes before and after, and is repacked in place. Group g of a
// matrix with row_bytes R per row occupies bytes [8 g R, 8 (g + 1) R), as
// rows 8g .. 8g+7 did; inside it, "group-block" b (the 8 rows' block b) is
// 8 * type_size bytes at 8 * b * type_size. Layouts per group-block
// (row r = 0..7 of the group; "word t" = bytes 4t .. 4t+3 of a field):
//   Q4_K_R8 (1152 = 8 x 144 bytes):
//     [0, 16)      fp16 d of rows 0..7          [16, 32)  fp16 dmin of rows 0..7
//     [32, 128)    the 12 scale bytes as 3 words: word i of row r at 32 + 32 i + 4 r
//     [128, 1152)  qs: word t (t < 32) of row r at 128 + 32 t + 4 r
//   Q6_K_R8 (1680 = 8 x 210 bytes):
//     [0, 1024)    ql: word t (t < 32) of row r at 32 t + 4 r
//     [1024, 1536) qh: word v (v < 16) of row r at 1024 + 32 v + 4 r
//     [1536, 1664) scales: bytes 2p, 2p+1 (p < 8) of row r at 1536 + 16 p + 2 r
//     [1664, 1680) fp16 d of rows 0..7
//   The 32-value blocks: [0, 16) fp16 d of rows 0..7, then
//     Q8_0_R8 (272 = 8 x 34):  [16, 272) qs: word t (t < 8) of row r at 16 + 32 t + 4 r
//     Q5_0_R8 (176 = 8 x 22):  [16, 48) qh of row r at 16 + 4 r;
//                              [48, 176) qs: word t (t < 4) of row r at 48 + 32 t + 4 r
//     Q4_0_R8 (144 = 8 x 18):  [16, 144) qs: word t (t < 4) of row r at 16 + 32 t + 4 r
//     Q4_1_R8 (160 = 8 x 20):  [16, 32) fp16 m of rows 0..7;
//                              [32, 160) qs: word t (t < 4) of row r at 32 + 32 t + 4 r
// Repacked type ids are Lever's own (kRepackedTypeOffset + the ggml id); they
// never appear in a GGUF file: weights are repacked as a resident model
// loads (or by `lever convert` into a store), and a row can always be
// restored (unpack_rows).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lever {

constexpr int kRepackRows = 8;             // rows per interleaved group
constexpr int kRepackedTypeOffset = 1000;  // repacked id = offset + ggml id
constexpr int kTypeQ4_0_R8 = kRepackedTypeOffset + 2;
constexpr int kTypeQ4_1_R8 = kRepackedTypeOffset + 3;
constexpr int kTypeQ5_0_R8 = kRepackedTypeOffset + 6;
constexpr int kTypeQ8_0_R8 = kRepackedTypeOffset + 8;
constexpr int kTypeQ4_K_R8 = kRepackedTypeOffset + 12;
constexpr int kTypeQ6_K_R8 = kRepackedTypeOffset + 14;

// True for a repacked type id.
bool is_repacked_type(int type);
// The ggml type a repacked type was made from; `type` itself otherwise.
int base_type(int type);
// The repacked type of ggml `type`, or -1 if it has none.
int repacked_type(int type);
// True if an [N, K] matrix of ggml `type` can be repacked: the type has a
// repacked form (Q4_K, Q6_K, Q8_0, Q5_0, Q4_0, Q4_1), N is a multiple of
// kRepackRows and K of the block size.
bool can_repack(int type, size_t N, size_t K);

// Repacks the [N, K] matrix w of ggml `type` in place (the bytes of one group
// are permuted through a small scratch buffer). Throws std::invalid_argument
// if !can_repack(type, N, K).
void repack_rows(int type, uint8_t* w, size_t N, size_t K);

// Rows [first, first + n) of the repacked [N, K] matrix w (repacked `type`)
// in their original ggml layout, into out (n * row bytes). Throws
// std::invalid_argument for a bad type or range.
void unpack_rows(int type, const uint8_t* w, size_t N, size_t K, size_t first, size_t n,
                 uint8_t* out);

// One group-block of a repacked type -> the 8 rows' original blocks
// (out[r * type_size .. ]), and back. `type` is the repacked type.
void unpack_group_block(int type, const uint8_t* in, uint8_t* out);
void pack_group_block(int type, const uint8_t* in, uint8_t* out);

// True if resident weights should be repacked in this process: the default
// instruction set (qmatmul.h) is AVX2 or AVX-512, which have repacked kernels
// that are bit-equal to the kernels for weights in their original layout
// (both equal the scalar ones). Not on NEON or scalar (no repacked kernels:
// the fallback unpacks every group and would only cost time). The
// environment variable LEVER_REPACK=0 turns repacking off (for A/B
// measurements).
bool should_repack();

}  // namespace lever
