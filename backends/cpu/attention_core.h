// Internals shared by the CPU backends: exact widening of 16-bit inputs, the
// key gather through the block table, and an attention core with a GPU
// kernel's precision (fp32 logits and sums, P rounded to the model dtype).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backends/backend.h"

namespace mlagate::detail {

// Deliberate faults for the planted-bug backends of the tests. Production
// backends always run with the defaults.
struct KernelFaults {
  int extra_visible_keys = 0;             // keys seen past the causal limit, clamped to the sequence
  bool last_key_from_null_block = false;  // decode reads each request's last key from block 0
  // fp8 readers (decode's key gather) and cpu.paged's cache writer.
  bool reader_ignores_k_scale = false;    // fp8/fp8_e4m3 read as e4m3 alone, without * k_scale
  bool reader_pow2_scales = false;        // fp8_ds_mla tile scales read as 2^exponent (mantissa dropped)
  bool writer_truncates = false;          // e4m3 rounded toward zero instead of to nearest even
  bool writer_saturates_240 = false;      // e4m3 clamped to +-240 (the e4m3fnuz range) instead of 448
  // decode's softmax takes exp(s) without subtracting the row max, as a
  // split-KV partial kept in fp32 without a running max does: exact until a
  // logit passes ~88.7, then exp overflows to inf and the output is NaN.
  bool softmax_without_max = false;
  // decode computes a key's slot as block * 16 + offset whatever the cache's
  // block size (a stride hard-coded to the backend's preferred size): exact at
  // block size 16, wrong keys at every other.
  bool block_stride_16 = false;
  // Layouts (cases/LAYOUTS.md), each exact on contiguous tensors and fitted pools:
  // a block's byte offset computed in unsigned 32 bits (block * block_bytes
  // wraps past 4 GiB: a page low in the pool is read instead);
  bool offset_32bit = false;
  // q_lat read with the row stride of its width (L), not its view's: right
  // for a contiguous q_lat, wrong rows for a slice of a fused q;
  bool q_stride_is_width = false;
  // every o_lat row written out to its view's row stride (zeros past L), as a
  // kernel that writes whole padded tiles: nothing past L in a contiguous
  // output, the neighbouring buffer's bytes in a larger one;
  bool writes_row_padding = false;
  // keys gathered into a workspace one physical block at a time, each block
  // once, and each request's blocks looked up at its own running count of
  // blocks, as if no two requests shared a page: shifted keys once they do.
  bool blocks_not_shared = false;
};

// cpu.paged with faults planted (tests only); make_cpu_paged() is this with none.
std::unique_ptr<Backend> make_cpu_paged_with_faults(const KernelFaults& faults);

// Keys seen by query u of a request with q_len queries over kv_len keys: the
// bottom-right causal rule, keys 0 .. kv_len - q_len + u, clamped to [0, kv_len].
inline int visible_keys(int kv_len, int q_len, int u, int extra = 0) {
  const int v = kv_len - q_len + u + 1 + extra;
  return v < 0 ? 0 : (v > kv_len ? kv_len : v);
}

// 16-bit model-dtype bits -> fp32 (exact). dt: kBF16 or kF16.
void widen(const std::uint16_t* src, float* dst, std::int64_t n, DType dt);
// fp32 -> model-dtype bits, round to nearest even (cases/encoding.h).
void narrow(const float* src, std::uint16_t* dst, std::int64_t n, DType dt);
// Rounds fp32 values in place to the nearest model-dtype value (RNE), exactly
// as narrow() then widen() would.
void round_to_model_dtype(float* x, std::int64_t n, DType dt);
// Throws std::invalid_argument unless dt is a 16-bit model dtype.
void check_model_dtype(DType dt, const char* what);

// Every key of every request of a decode call, widened (auto) or dequantized
// on load (fp8: e4m3 * k_scale; fp8_ds_mla: e4m3 * tile scale, bf16 RoPE) to
// fp32 in request order: [sum seq_lens, L+R], request b from row start[b]. A backend keeps one
// across calls: the buffer only grows, so a large case does not pay the
// first-touch page faults of a fresh ~100 MB allocation on every call.
struct GatheredKeys {
  std::vector<float> data;
  std::vector<std::int64_t> start;  // [B+1]
  int width = 0;                    // L + R
};
// Validates the decode arguments (shapes, dtypes, block ids; throws
// std::invalid_argument / std::out_of_range) and gathers the keys into `keys`.
void gather_keys(const DecodeArgs& args, const KernelFaults& faults, GatheredKeys& keys);

// A block of decode rows of one request: rows r of the request are (token u,
// head n) with r = u * N + n, i.e. flat index query_start_loc[b] * N + r.
struct RowBlock {
  int request = 0;
  int first_row = 0;
  int rows = 0;
};
// cpu.paged's cache writer for every kv cache dtype: its own quantization
// code (not the reference writer's), so the cache_write op checks something.
// kv_c: [n, L], k_pe: [n, R] model dtype; negative slots are skipped.
void write_cache(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                 std::span<const std::int64_t> slots, const KernelFaults& faults);

// Cuts every request's rows into blocks small enough to share among threads.
std::vector<RowBlock> plan_row_blocks(std::span<const std::int32_t> query_start_loc, int num_heads);

// A decode call's keys gathered (gather_keys) and what both CPU decoders read
// of its arguments: heads, latent width, key width, dtype, the row blocks and
// the output pointers.
struct DecodeCall {
  DecodeCall(const DecodeArgs& a, const KernelFaults& faults, GatheredKeys& keys);
  int n = 0, l = 0, d = 0;
  DType dt = DType::kBF16;
  std::vector<RowBlock> blocks;
  std::uint16_t* o_lat = nullptr;
  float* lse = nullptr;
  int num_blocks = 0;
  // Strides of o_lat (token, head) and lse (token, head) in elements: the
  // views' own (cases/LAYOUTS.md), contiguous ones by default.
  std::int64_t o_stride_t = 0, o_stride_h = 0, lse_stride_t = 0, lse_stride_h = 0;
  bool writes_row_padding = false;  // KernelFaults::writes_row_padding
  // Writes the fp32 rows o [blk.rows, l] and lse [blk.rows] of a row block
  // to the outputs, narrowed to the model dtype, through the strides.
  void store_rows(const DecodeArgs& a, const RowBlock& blk, const float* o, const float* row_lse) const;
};

// Stacks the [q_lat, q_pe] rows of a block into q [rows, L+R] and sets, per
// row, how many of the request's keys it sees.
void load_decode_rows(const DecodeArgs& args, const RowBlock& blk, const KernelFaults& faults,
                      std::vector<float>& q, std::vector<int>& visible);

// One block of query rows attending to a range of keys.
struct AttendInput {
  const float* q = nullptr;  // [rows, dqk], contiguous
  int rows = 0;
  int dqk = 0;
  const float* k = nullptr;  // [nk, dqk], row stride k_stride
  std::int64_t k_stride = 0;
  const float* v = nullptr;  // [nk, dv], row stride v_stride
  std::int64_t v_stride = 0;
  int dv = 0;
  int nk = 0;
  const int* visible = nullptr;  // [rows]: row r sees keys 0 .. visible[r]-1 of the range
  float scale = 0;
  DType p_dtype = DType::kBF16;  // P is rounded to this before P@V, as GPU kernels do
  bool without_max = false;      // planted fault only (KernelFaults::softmax_without_max)
};

// Scratch of attend(), reused across calls by one thread. Its rows start on
// 64-byte boundaries: Eigen's vectorized exp and sum peel an unaligned head
// with scalar code, which would make the bits depend on the allocation.
class AttendScratch {
 public:
  float* floats(std::size_t n);  // 64-byte aligned, valid until the next call

 private:
  std::vector<float> buf_;
};

// Outputs o [rows, dv] fp32, normalized; lse [rows]. Rows that see no key get
// o = 0 and lse = -inf.
void attend(const AttendInput& in, float* o, float* lse, AttendScratch& scratch);

}  // namespace mlagate::detail
