// The attention core of the CPU backends and the decode plumbing they share:
// argument checks, the key gather through the block table (dequantizing fp8
// caches on load), row blocking.
// Eigen float GEMMs for Q K^T and P V; OpenMP is used by the callers.
#include "backends/cpu/attention_core.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <Eigen/Core>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/fp8.h"

namespace mlagate::detail {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using ConstMatMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using AlignedArrMap = Eigen::Map<Eigen::ArrayXf, Eigen::Aligned64>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::size_t kAlignBytes = 64;
constexpr std::int64_t kAlignFloats = kAlignBytes / sizeof(float);
// Rows per decode block: enough to make the GEMMs efficient, small enough for
// every thread to get work. Fixed, never from the thread count: Eigen's GEMM
// sums a row differently when it falls in the row remainder of a block.
constexpr int kRowsPerBlock = 128;

// fp16 -> fp32 for all 65536 bit patterns, from the project's own conversion.
const float* f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_f32(static_cast<std::uint16_t>(i));
    return t;
  }();
  return table.data();
}

[[noreturn]] void bad_arg(const std::string& what) { throw std::invalid_argument("decode: " + what); }

// e4m3fn -> fp32 for all 256 codes.
const float* e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<std::size_t>(i)] = e4m3_to_f32(static_cast<std::uint8_t>(i));
    return t;
  }();
  return table.data();
}

// Where the fields of one token's entry sit, for the dtypes these kernels read.
struct EntryLayout {
  KvCacheDtype dtype = KvCacheDtype::kAuto;
  int l = 0, r = 0;
  int tiles = 0;         // fp8_ds_mla: fp32 scales of 128-element NoPE tiles at byte l
  int rope_offset = 0;   // byte offset of k_pe
  int bytes = 0;
};

EntryLayout entry_layout(KvCacheDtype dtype, int l, int r) {
  EntryLayout e{dtype, l, r};
  switch (dtype) {
    case KvCacheDtype::kAuto:
      e.rope_offset = 2 * l;
      e.bytes = 2 * (l + r);
      break;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3:
      e.rope_offset = l;
      e.bytes = l + r;
      break;
    case KvCacheDtype::kFp8DsMla:
      if (l % 128 != 0) bad_arg("fp8_ds_mla needs L a multiple of 128, got " + std::to_string(l));
      e.tiles = l / 128;
      e.rope_offset = l + 4 * e.tiles;
      e.bytes = e.rope_offset + 2 * r;
      break;
    case KvCacheDtype::kFp8V4:  // the runner never asks (capabilities); the sparse backends read it
      throw NotSupportedError("fp8_v4 is DeepSeek V4's sparse cache, not read by the dense CPU kernels");
  }
  return e;
}

// One fp8 entry dequantized on load into dst [l + r] fp32.
void dequantize_entry(const EntryLayout& e, const std::uint8_t* src, float* dst, float k_scale, const KernelFaults& faults) {
  const float* table = e4m3_table();
  if (e.dtype != KvCacheDtype::kFp8DsMla) {
    for (int i = 0; i < e.l + e.r; ++i) dst[i] = table[src[i]] * k_scale;
    return;
  }
  for (int t = 0; t < e.tiles; ++t) {
    std::uint32_t bits;
    std::memcpy(&bits, src + e.l + 4 * t, 4);
    // The planted fault: a reader written for power-of-two (UE8M0-style) scales keeps only the exponent.
    if (faults.reader_pow2_scales) bits &= 0xFF800000u;
    const float scale = std::bit_cast<float>(bits);
    for (int i = t * 128; i < (t + 1) * 128; ++i) dst[i] = table[src[i]] * scale;
  }
  for (int i = 0; i < e.r; ++i) {
    std::uint16_t b;
    std::memcpy(&b, src + e.rope_offset + 2 * i, 2);
    dst[e.l + i] = std::bit_cast<float>(std::uint32_t{b} << 16);
  }
}

}  // namespace

void widen(const std::uint16_t* src, float* dst, std::int64_t n, DType dt) {
  if (dt == DType::kBF16) {
    // bf16 is the top half of an fp32: the shift is the exact conversion.
    for (std::int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(std::uint32_t{src[i]} << 16);
  } else {
    const float* table = f16_table();
    for (std::int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
  }
}

void narrow(const float* src, std::uint16_t* dst, std::int64_t n, DType dt) {
  if (dt == DType::kBF16) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
  }
}

void round_to_model_dtype(float* x, std::int64_t n, DType dt) {
  if (dt == DType::kBF16) {
    // f32_to_bf16 inlined so the loop vectorizes: it runs once per probability.
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t u = std::bit_cast<std::uint32_t>(x[i]);
      const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
      const std::uint32_t r = nan ? (u | 0x00400000u) : u + 0x7FFFu + ((u >> 16) & 1u);
      x[i] = std::bit_cast<float>(r & 0xFFFF0000u);
    }
  } else {
    const float* table = f16_table();
    for (std::int64_t i = 0; i < n; ++i) x[i] = table[f32_to_f16(x[i])];
  }
}

void check_model_dtype(DType dt, const char* what) {
  if (dt != DType::kBF16 && dt != DType::kF16) {
    throw std::invalid_argument(std::string(what) + ": dtype " + std::string(dtype_name(dt)) +
                                " is not a 16-bit model dtype");
  }
}

void gather_keys(const DecodeArgs& a, const KernelFaults& faults, GatheredKeys& keys) {
  check_decode_args(a);  // every block id in range: a bad one throws here, not inside a parallel loop
  const PagedCache& cache = *a.cache;
  const std::int64_t l = a.q_lat.shape[2], r = a.q_pe.shape[2];
  const DType dt = a.q_lat.dtype;
  const EntryLayout layout = entry_layout(cache.kv_dtype, static_cast<int>(l), static_cast<int>(r));
  if (cache.entry_bytes != layout.bytes) {
    bad_arg("cache entry of " + std::to_string(cache.entry_bytes) + " bytes, expected " + std::to_string(layout.bytes) +
            " for kv cache dtype " + std::string(kv_cache_dtype_name(cache.kv_dtype)) + " with L = " +
            std::to_string(l) + ", R = " + std::to_string(r));
  }
  if (is_fp8(cache.kv_dtype) && !(a.k_scale > 0 && std::isfinite(a.k_scale))) bad_arg("k_scale must be positive and finite");

  const std::size_t b = a.seq_lens.size();
  const int bs = cache.block_size;
  const std::int64_t width = cache.block_table.dim(1);
  const std::int32_t* table = cache.block_table.data<std::int32_t>();
  keys.width = static_cast<int>(l + r);
  keys.start.assign(b + 1, 0);
  for (std::size_t i = 0; i < b; ++i) keys.start[i + 1] = keys.start[i] + a.seq_lens[i];

  std::vector<std::int64_t> slots(static_cast<std::size_t>(keys.start[b]));
  // The planted blocks_not_shared fault: physical blocks in order of first use.
  std::vector<std::int32_t> first_use;
  if (faults.blocks_not_shared) {
    std::vector<bool> seen(static_cast<std::size_t>(cache.num_blocks), false);
    for (std::size_t i = 0; i < b; ++i)
      for (int blk = 0; blk * bs < a.seq_lens[i]; ++blk) {
        const std::int32_t id = table[a.block_table_rows[i] * width + blk];
        if (!seen[static_cast<std::size_t>(id)]) seen[static_cast<std::size_t>(id)] = true, first_use.push_back(id);
      }
  }
  std::int64_t running = 0;  // blocks of the requests before, for blocks_not_shared
  for (std::size_t i = 0; i < b; ++i) {
    const int row = a.block_table_rows[i];
    const int s = a.seq_lens[i];
    for (int p = 0; p < s; ++p) {
      std::int64_t block = table[row * width + p / bs];
      if (faults.last_key_from_null_block && p == s - 1) block = 0;
      if (faults.blocks_not_shared)
        block = first_use[static_cast<std::size_t>(std::min<std::int64_t>(running + p / bs, static_cast<std::int64_t>(first_use.size()) - 1))];
      slots[keys.start[i] + p] = block * bs + p % bs;
      // The planted stride bug, kept inside the cache (a CPU test process must not fault).
      if (faults.block_stride_16) slots[keys.start[i] + p] = (block * 16 + p % bs) % (static_cast<std::int64_t>(cache.num_blocks) * bs);
      // The planted 32-bit offset: the block's byte offset wraps at 2^32, in the pool.
      if (faults.offset_32bit)
        slots[keys.start[i] + p] = static_cast<std::uint32_t>(block * cache.block_bytes) / cache.entry_bytes + p % bs;
    }
    running += (s + bs - 1) / bs;
  }

  if (keys.data.size() < slots.size() * keys.width) keys.data.resize(slots.size() * keys.width);
  const std::int64_t total = static_cast<std::int64_t>(slots.size());
  if (cache.kv_dtype == KvCacheDtype::kAuto) {
#pragma omp parallel for schedule(static)
    for (std::int64_t j = 0; j < total; ++j) {
      widen(reinterpret_cast<const std::uint16_t*>(cache.entry(slots[j])), keys.data.data() + j * keys.width,
            keys.width, dt);
    }
    return;
  }
  const float k_scale = faults.reader_ignores_k_scale ? 1.f : a.k_scale;
#pragma omp parallel for schedule(static)
  for (std::int64_t j = 0; j < total; ++j) {
    dequantize_entry(layout, reinterpret_cast<const std::uint8_t*>(cache.entry(slots[j])),
                     keys.data.data() + j * keys.width, k_scale, faults);
  }
}

DecodeCall::DecodeCall(const DecodeArgs& a, const KernelFaults& faults, GatheredKeys& keys) {
  gather_keys(a, faults, keys);
  n = static_cast<int>(a.q_lat.shape[1]);
  l = static_cast<int>(a.q_lat.shape[2]);
  d = keys.width;
  dt = a.q_lat.dtype;
  blocks = plan_row_blocks(a.query_start_loc, n);
  o_lat = a.o_lat.as<std::uint16_t>();
  lse = a.lse.as<float>();
  num_blocks = static_cast<int>(blocks.size());
  o_stride_t = a.o_lat.stride(0), o_stride_h = a.o_lat.stride(1);
  lse_stride_t = a.lse.stride(0), lse_stride_h = a.lse.stride(1);
  writes_row_padding = faults.writes_row_padding;
}

void DecodeCall::store_rows(const DecodeArgs& a, const RowBlock& blk, const float* o, const float* row_lse) const {
  const std::int64_t t0 = a.query_start_loc[blk.request];
  for (int i = 0; i < blk.rows; ++i) {
    const std::int64_t row = blk.first_row + i, t = t0 + row / n, h = row % n;
    std::uint16_t* dst = o_lat + t * o_stride_t + h * o_stride_h;
    narrow(o + static_cast<std::int64_t>(i) * l, dst, l, dt);
    // The planted fault: the row's padding up to the next head's row zeroed.
    if (writes_row_padding && o_stride_h > l) std::fill(dst + l, dst + o_stride_h, std::uint16_t{0});
    lse[t * lse_stride_t + h * lse_stride_h] = row_lse[i];
  }
}

std::vector<RowBlock> plan_row_blocks(std::span<const std::int32_t> query_start_loc, int num_heads) {
  std::vector<RowBlock> blocks;
  for (std::size_t b = 0; b + 1 < query_start_loc.size(); ++b) {
    const int rows = (query_start_loc[b + 1] - query_start_loc[b]) * num_heads;
    for (int r = 0; r < rows; r += kRowsPerBlock) {
      blocks.push_back({static_cast<int>(b), r, std::min(kRowsPerBlock, rows - r)});
    }
  }
  return blocks;
}

void load_decode_rows(const DecodeArgs& a, const RowBlock& blk, const KernelFaults& faults,
                      std::vector<float>& q, std::vector<int>& visible) {
  const int n = static_cast<int>(a.q_lat.shape[1]);
  const int l = static_cast<int>(a.q_lat.shape[2]);
  const int r = static_cast<int>(a.q_pe.shape[2]);
  const int d = l + r;
  const int b = blk.request;
  const int q_len = a.query_start_loc[b + 1] - a.query_start_loc[b];
  const std::uint16_t* q_lat = a.q_lat.as<std::uint16_t>();
  const std::uint16_t* q_pe = a.q_pe.as<std::uint16_t>();
  // The views' strides (cases/LAYOUTS.md); the planted fault reads q_lat as if contiguous.
  const std::int64_t ql_t = faults.q_stride_is_width ? n * l : a.q_lat.stride(0);
  const std::int64_t ql_h = faults.q_stride_is_width ? l : a.q_lat.stride(1);
  const std::int64_t qp_t = a.q_pe.stride(0), qp_h = a.q_pe.stride(1);
  q.resize(static_cast<std::size_t>(blk.rows) * d);
  visible.resize(blk.rows);
  for (int i = 0; i < blk.rows; ++i) {
    const int row = blk.first_row + i;
    const std::int64_t t = a.query_start_loc[b] + row / n, h = row % n;
    widen(q_lat + t * ql_t + h * ql_h, q.data() + static_cast<std::size_t>(i) * d, l, a.q_lat.dtype);
    widen(q_pe + t * qp_t + h * qp_h, q.data() + static_cast<std::size_t>(i) * d + l, r, a.q_lat.dtype);
    visible[i] = visible_keys(a.seq_lens[b], q_len, row / n, faults.extra_visible_keys);
  }
}

float* AttendScratch::floats(std::size_t n) {
  buf_.resize(n + kAlignFloats);
  const auto addr = reinterpret_cast<std::uintptr_t>(buf_.data());
  const std::uintptr_t pad = (kAlignBytes - addr % kAlignBytes) % kAlignBytes;
  return buf_.data() + pad / sizeof(float);
}

void attend(const AttendInput& in, float* o, float* lse, AttendScratch& scratch) {
  MatMap out(o, in.rows, in.dv, Eigen::OuterStride<>(in.dv));
  int nk = 0;
  for (int i = 0; i < in.rows; ++i) nk = std::max(nk, std::min(in.visible[i], in.nk));
  if (nk == 0) {
    out.setZero();
    std::fill(lse, lse + in.rows, kNegInf);
    return;
  }

  // [rows, nk] scores with aligned rows (then P in place), followed by the row sums.
  const std::int64_t stride = (nk + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  float* logits = scratch.floats(static_cast<std::size_t>(in.rows * stride + in.rows));
  float* sums = logits + in.rows * stride;
  MatMap s(logits, in.rows, nk, Eigen::OuterStride<>(stride));
  const ConstMatMap q(in.q, in.rows, in.dqk, Eigen::OuterStride<>(in.dqk));
  const ConstMatMap k(in.k, nk, in.dqk, Eigen::OuterStride<>(in.k_stride));
  s.noalias() = q * k.transpose();

  for (int i = 0; i < in.rows; ++i) {
    float* row = logits + i * stride;
    const int vis = std::min(in.visible[i], in.nk);
    std::fill(row + vis, row + nk, 0.f);
    if (vis == 0) {
      sums[i] = 0;
      lse[i] = kNegInf;
      continue;
    }
    AlignedArrMap p(row, vis);
    p *= in.scale;
    const float m = in.without_max ? 0.f : p.maxCoeff();
    p = (p - m).exp();
    sums[i] = p.sum();
    lse[i] = m + std::log(sums[i]);
    // The sum above is of the unrounded probabilities; P@V sees them rounded,
    // as a GPU kernel feeding P to a 16-bit tensor-core MMA does.
    round_to_model_dtype(row, vis, in.p_dtype);
  }

  const ConstMatMap v(in.v, nk, in.dv, Eigen::OuterStride<>(in.v_stride));
  out.noalias() = s * v;
  for (int i = 0; i < in.rows; ++i) {
    // Rows without keys are set, not computed: 0 * NaN from a V row must not leak.
    if (sums[i] == 0) {
      out.row(i).setZero();
    } else {
      out.row(i) /= sums[i];
    }
  }
}

}  // namespace mlagate::detail
