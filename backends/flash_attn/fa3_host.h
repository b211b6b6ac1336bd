// FlashAttention-3's host side as flash_api.cpp has it, shared by the
// adapters that call FA3's Hopper forward (flash_attn.mla, flash_attn.mla.sparse):
// its head-dim rounding and heuristics (tile size, paged TMA, PackGQA, split
// count, the causal rule) on a filled Flash_fwd_params, the dispatch to the
// hdim64_512 instantiations this build compiles, the split partials, the
// combine and the lse transpose. Internal: includes FA3's headers.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include <cutlass/numeric_types.h>

#include "flash.h"
#include "gpu/device.h"
#include "heuristics.h"
#include "tile_size.h"

namespace mlagate::fa3 {

using gpu::DeviceBuffer;

constexpr int kPrepareMaxBatches1Cta = 992;  // flash_api.cpp's PREPARE_VARLEN_MAX_BATCHES_1CTA

// The decode instantiations (hdim64_512): q/k head dim <= 64 with a V head dim
// in (256, 512] (flash_api.cpp dispatches dv > 256 to 64 x 512).
inline std::string decode_dims_reason(int L, int R) {
  if (R == 0)  // NoPE MLA (dims nope): FA3's MLA path takes q = q_pe, k = k_pe; there is none
    return "q_pe/k_pe head dim (R) 0: FA3's MLA decode takes q = q_pe and k = k_pe (NoPE MLA has no rotary part)";
  if (R > 64 || R % 8 != 0)
    return "q_pe/k_pe head dim (R) " + std::to_string(R) + ": the MLA instantiations take head dim <= 64, a multiple of 8";
  if (L <= 256 || L > 512 || L % 8 != 0)
    return "q_v/V head dim (L) " + std::to_string(L) + ": the build has hdim64_512 only (V head dim in (256, 512], a multiple of 8)";
  return {};
}

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }
// flash_api.cpp's round_up_headdim / round_up_headdimv.
inline int round_up_headdim(int d) { return d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : d <= 192 ? 192 : 256; }
inline int round_up_headdimv(int d) {
  return d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : d <= 192 ? 192 : d <= 256 ? 256 : 512;
}

// --- flash_api.cpp's host heuristics, on a filled Flash_fwd_params -----------

inline std::tuple<int, int, bool, bool> tile_sm90(const Flash_fwd_params& p, bool paged_non_tma) {
  return tile_size_fwd_sm90(p.d_rounded, p.dv_rounded, p.is_causal, p.is_local, 2, false, paged_non_tma, p.softcap > 0.f);
}

inline bool get_pagedkv_tma(const Flash_fwd_params& p) {
  if (!p.page_table || p.leftpad_k || p.knew_ptr) return false;
  const auto [kBlockM, kBlockN, rs, overlap] = tile_sm90(p, false);
  // flash_api.cpp: "when seqlen_q <= kBlockM, we're not compute bound, and somehow using TMA is slower".
  return p.page_size % kBlockN == 0 && p.seqlen_q * (p.h / p.h_k) > kBlockM;
}

inline bool get_pack_gqa(const Flash_fwd_params& p) {
  if ((p.page_table && !p.pagedkv_tma) || p.num_splits > 1) return true;
  if (p.h == p.h_k) return false;
  const int kBlockM = std::get<0>(tile_sm90(p, p.page_table && !p.pagedkv_tma));
  return should_pack_gqa(p.cu_seqlens_q || p.seqused_q, p.seqlen_q, p.h / p.h_k, kBlockM);
}

inline int get_num_splits(const Flash_fwd_params& p) {
  const auto [kBlockM, kBlockN, rs, overlap] = tile_sm90(p, p.page_table && !p.pagedkv_tma);
  const int seqlen_q_packgqa = p.seqlen_q * (p.h / p.h_k);
  const int num_n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  const int num_m_blocks = (seqlen_q_packgqa + kBlockM - 1) / kBlockM;
  const int size_one_kv_head = p.seqlen_k * (p.d + p.dv) * 2;
  const int total_mblocks = (p.num_splits_dynamic_ptr ? 1 : p.b) * p.h_k * num_m_blocks;
  return num_splits_heuristic(total_mblocks, p.num_sm, num_n_blocks, num_m_blocks, size_one_kv_head,
                              p.is_causal || p.is_local, 128);
}

// The causal rule of mha_fwd and get_scheduler_metadata (no window, no chunk):
// with one query row, causal is plain attention, except for head dims in
// (64, 128] with a page table (FA3 keeps kBlockN 128 for them). Call it with
// page_table set or not as the call will have it.
inline void set_mask(Flash_fwd_params& p, bool causal) {
  if (p.seqlen_q == 1 && (p.d <= 64 || p.d > 128 || !p.page_table)) causal = false;
  p.is_causal = causal;
  p.is_local = false;
  p.window_size_left = p.seqlen_k - 1;
  p.window_size_right = causal ? 0 : p.seqlen_q - 1;
  p.attention_chunk = 0;
}

// The layout of the scheduler metadata (flash_api.cpp): {num_splits_dynamic,
// num_m_blocks, varlen_batch_idx, num_nheads_in_l2} of round_up(b, 4) ints each
// (the last two only with sorted batches / head swizzle), then the semaphore.
struct MetadataLayout {
  int b_rounded = 0, vectors = 0;
  int size() const { return 1 + b_rounded * vectors; }  // sm90 always needs the semaphore
  int semaphore_offset() const { return b_rounded * vectors; }
};

inline MetadataLayout metadata_layout(const Flash_fwd_params& p) {
  MetadataLayout m;
  m.b_rounded = round_up(p.b, 4);
  m.vectors = 2 + (p.varlen_sort_batches ? 1 : 0) + (p.head_swizzle ? 1 : 0);
  return m;
}

inline void point_into_metadata(Flash_fwd_params& p, int* meta) {
  const MetadataLayout m = metadata_layout(p);
  p.num_splits_dynamic_ptr = meta;
  p.num_m_blocks_ptr = meta + m.b_rounded;
  p.varlen_batch_idx_ptr = p.varlen_sort_batches ? meta + m.b_rounded * 2 : nullptr;
  p.num_nheads_in_l2_ptr = p.head_swizzle ? meta + m.b_rounded * (p.varlen_sort_batches ? 3 : 2) : nullptr;
  p.tile_count_semaphore = meta + m.semaphore_offset();
  p.tile_count_semaphore_offset = m.semaphore_offset();
}

// --- the instantiations this build has ---------------------------------------

// flash_api.cpp's run_mha_fwd for head dims 64 / 512 (PackGQA is forced with
// split or non-TMA paged KV, as there).
template <class T>
void run_decode_fwd(Flash_fwd_params& p, cudaStream_t s) {
  const bool split = p.num_splits > 1, paged_non_tma = p.page_table && !p.pagedkv_tma;
  if (split && paged_non_tma) return run_mha_fwd_<90, T, 64, 512, true, true, false, true>(p, s);
  if (split) return run_mha_fwd_<90, T, 64, 512, true, false, false, true>(p, s);
  if (paged_non_tma) return run_mha_fwd_<90, T, 64, 512, false, true, false, true>(p, s);
  if (p.pack_gqa) return run_mha_fwd_<90, T, 64, 512, false, false, false, true>(p, s);
  return run_mha_fwd_<90, T, 64, 512, false, false, false, false>(p, s);
}

// mha_fwd after a split forward: the combine writes the output in the model
// dtype and resets the semaphore.
void run_combine(Flash_fwd_params p, bool bf16, cudaStream_t s);

// FA3's varlen lse [N, T] -> mlagate's [T, N].
void transpose_lse(const float* src, float* dst, int N, int T, cudaStream_t s);

// The split partials (mha_fwd's out_accum [S, N, T, dv] and softmax_lse_accum
// [S, N, T], varlen q), poisoned: a partial the kernel never writes shows.
struct SplitPartials {
  DeviceBuffer o, lse;
  void allocate(Flash_fwd_params& p, int T, cudaStream_t s) {
    const std::int64_t N = p.h, dv = p.dv, S = p.num_splits;
    o = DeviceBuffer(static_cast<std::size_t>(S * N * T * dv) * sizeof(float));
    lse = DeviceBuffer(static_cast<std::size_t>(S * N * T) * sizeof(float));
    o.fill(0xFF, s);
    lse.fill(0xFF, s);
    p.is_fp32 = false;
    p.oaccum_ptr = o.data();
    p.softmax_lseaccum_ptr = lse.data();
    p.oaccum_split_stride = N * T * dv;
    p.oaccum_row_stride = dv;
    p.oaccum_head_stride = T * dv;
    p.lseaccum_split_stride = N * T;
    p.lseaccum_head_stride = T;
  }
};

}  // namespace mlagate::fa3
