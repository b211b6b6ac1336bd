// The per-case memory estimates (memory_estimate.h), term by term as the
// runner and the GPU code allocate, and the refusals of cases beyond them.
#include "harness/reliability/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cases/errors.h"

namespace mlagate {

std::uint64_t estimate_case_bytes(const CaseSpec& spec, bool prefill_op) {
  const double L = spec.dims.kv_lora_rank, R = spec.dims.rope_dim, P = spec.dims.nope_dim, V = spec.dims.v_head_dim;
  const double N = spec.num_heads();
  double T = 0, S = 0, B = static_cast<double>(spec.batch.seq_lens.size());
  for (int q : spec.batch.query_lens) T += q;
  double S_up = 0;  // tokens whose keys and values are up-projected
  for (std::size_t i = 0; i < spec.batch.seq_lens.size(); ++i) {
    S += spec.batch.seq_lens[i];
    if (prefill_op || spec.batch.query_lens[i] > 1) S_up += spec.batch.seq_lens[i];
  }
  const double half = 2, f32 = 4, f64 = 8;
  double bytes = 0;
  bytes += T * N * (P + R) * half;                  // q
  bytes += S * (L + R) * half;                      // kv_c, k_pe
  bytes += L * N * (P + V) * half;                  // W_UK, W_UV
  bytes += T * N * (V + 1 + L + R) * f64 * 3;       // golden, baseline, unquantized references (out, lse, o_lat)
  bytes += (S + B * 1024) * (L + R) * half * 3;     // paged caches (two block sizes, padding blocks) and a copy
  bytes += S_up * N * (P + R + V) * half;           // up-projected k, v (prefill)
  bytes += T * N * (L + R) * (half * 2 + f32);      // absorbed queries, latent outputs, fp32 accumulators
  bytes += T * N * V * (half + f32) * 2;            // outputs with guard bands, merge buffers
  return static_cast<std::uint64_t>(bytes * 1.5);
}

std::uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream s(line.substr(13));
      std::uint64_t kib = 0;
      s >> kib;
      return kib * 1024;
    }
  return 0;
}

namespace {

double gib(std::uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

constexpr double kGiB = 1024.0 * 1024 * 1024, kMiB = 1024.0 * 1024;

// Device bytes of a merge case (the merge_states op): cuda.merge uploads both
// partial outputs and LSEs and writes a guarded output and LSE (fp32 at most).
double merge_device_bytes(const CaseSpec& spec) {
  double T = 0;
  for (int q : spec.batch.query_lens) T += q;
  const double rows = T * spec.num_heads(), D = spec.merge.head_dim;
  return rows * (D * 4 * 3 + 4 * 4);
}

// Bytes per element.
constexpr double half = 2, f32 = 4, f64 = 8;

// The case's sizes the device terms are made of.
struct CaseTerms {
  explicit CaseTerms(const CaseSpec& case_spec) : spec(case_spec) {
    for (std::size_t i = 0; i < spec.batch.seq_lens.size(); ++i) {
      const double s = spec.batch.seq_lens[i], q = spec.batch.query_lens[i];
      T += q;
      S += s;
      max_s = std::max(max_s, s);
      max_qs = std::max(max_qs, q * s);
      if (q > 1 && !spec.batch.spec_decode) S_pre1 += s;
      if (q > 512 && !spec.batch.spec_decode) S_pre512 += s;
    }
    // A paged cache on the device (cases/paged_cache.h): every request's blocks,
    // the null block and 100 spare ones, at the case's block size or the largest
    // preferred one (64); entries of 2 (L + R) bytes at most (fp8: L + R), and
    // its int32 block table (block size 1: a column per token, rows padded to 128).
    const double bs = spec.block_size > 0 ? spec.block_size : 64;
    entry = fp8 ? D : D * half;
    slots = S + (B + 101) * bs;
    cache = slots * entry + (S + B * 129) * f32;
    // V4's compressed cache: seq_len / ratio entries per request.
    slots_x = spec.sparse.compress > 0 ? S / spec.sparse.compress + B + (B + 101) * bs : 0;
    cache_x = slots_x > 0 ? slots_x * entry + (slots_x + B * 129) * f32 : 0;
  }

  const CaseSpec& spec;
  const double L = spec.dims.kv_lora_rank, R = spec.dims.rope_dim, P = spec.dims.nope_dim, V = spec.dims.v_head_dim;
  const double D = L + R, N = spec.num_heads();
  const double B = static_cast<double>(spec.batch.seq_lens.size());
  double T = 0, S = 0, max_s = 0, max_qs = 0;
  double S_pre1 = 0, S_pre512 = 0;  // tokens of the requests the layer sends to prefill (threshold 1, and 512: FA3)
  const double kv_row = N * (P + R + V) * half;  // one token's up-projected K and V
  const bool fp8 = spec.kv_cache_dtype == KvCacheDtype::kFp8 || spec.kv_cache_dtype == KvCacheDtype::kFp8E4m3;
  double entry = 0, slots = 0, cache = 0, slots_x = 0, cache_x = 0;
};

// What every non-merge case holds whichever backend runs: the GPU reference,
// the glue's up-projection, the baseline emulation and the cache store.
double shared_device_bytes(const CaseTerms& c, const DeviceEstimateOptions& opt) {
  double bytes = 0;
  // The GPU reference (reference/cuda/cuda_reference.cu, one case at a time,
  // freed on return): q, the latent keys (or their fp32 dequantized copy for
  // fp8 caches), W_UK and W_UV; q_full [T, N, L+R], o_lat [T, N, L], lse and
  // out [T, N, V] in fp64.
  bytes += c.T * c.N * (c.P + c.R) * half + c.S * c.D * f32 + c.L * c.N * (c.P + c.V) * half + c.T * c.N * (c.D + c.L + 1 + c.V) * f64;
  // The glue's up-projection on the GPU (reference/cuda/row_projection.cpp):
  // the weights widened to fp32, kept between calls (a new case's beside the
  // last one's while they are replaced), and chunks of at most 64 MiB of K
  // and V (of one 128-row tile at least) with their latent rows in fp32.
  const double S_up = opt.prefill_op ? c.S : c.S_pre1;
  if (S_up > 0) {
    const double chunk = std::min(S_up, 64 * kMiB / c.kv_row + 128);
    bytes += 2 * c.L * c.N * (c.P + c.V) * f32 + chunk * (c.kv_row + c.L * f32 + c.R * half);
  }
  // The baseline emulation's attention core on the GPU
  // (reference/cuda/attention_emulation.cu), each buffer kept and grown to
  // the largest call: every request's queries and outputs in fp32 (the
  // decode form's rows of N heads) and the decode form's keys in fp32; one
  // request's latent rows, widened, and their K and V projected in 16 bits;
  // the weights in fp32 (twice while a new case's replace the last); the
  // logits of a chunk of rows, 256 MiB or one row's if that is more.
  bytes += c.T * c.N * (c.D + c.L + 2) * f32 + c.S * c.D * f32 + c.max_s * (c.kv_row + c.L * f32 + c.D * half) +
           2 * c.L * c.N * (c.P + c.V) * f32 + std::max(std::min(256 * kMiB, c.max_qs * c.N * f32), c.N * c.max_s * f32);
  // The device cache store shared by the CUDA backends
  // (backends/cuda/cache_store.h): at most 6 entries and 8 GiB beside the
  // newest, which stays whatever its size; one more uploaded before an older
  // one goes, and a cache_write's private copy of the cache it writes. V4's
  // compressed cache is stored beside the main one.
  bytes += std::min(6 * c.cache, std::max(8 * kGiB, c.cache)) + 2 * c.cache + 2 * c.cache_x;
  return bytes;
}

// The sparse ops (backends/cuda/sparse.cu, flashmla_sparse.cu): q padded to
// FlashMLA's 64 or 128 heads, the index rows (padded to 64 or 128 slots) of
// the cache and the compressed cache, FlashMLA's split partials ([T + 160 SM
// parts, heads, 512] fp32), its outputs and the guarded ones;
// sparse_prefill's flat rows of every slot of both caches.
double sparse_call_bytes(const CaseTerms& c) {
  const double Hp = std::max(c.N, 128.0), dv = std::max<double>(c.spec.sparse_dv(), 512);
  const double K1 = std::max(c.spec.sparse.topk, c.spec.sparse.window), K2 = c.spec.sparse.extra_topk;
  double call = c.T * Hp * c.D * half + c.T * (K1 + K2 + 256) * f32 * 2 + (c.T + 160) * Hp * (dv + 1) * f32 +
                c.T * Hp * (dv * half + f32) * 2;
  call += (c.slots + c.slots_x) * c.D * half;
  return call;
}

// libtorch's caching allocator (backends/torch/torch_sdpa.cpp) keeps the
// blocks it took: decode's cache upload, fp8 entries dequantized through
// fp32 (1 + 4 + 4 + 2 bytes an element), the block table as int64, q_full
// (and its parts), o_all, lse_all, a request's gathered keys, and the math
// kernel's fp32 logits, scaled, masked and softmaxed copies (24 bytes a
// logit); prefill's q, o_all, K and V when not lent on the device (all of
// them for the prefill op).
double torch_reserve_bytes(const CaseTerms& c, const DeviceEstimateOptions& opt) {
  double t = c.slots * c.entry + (c.fp8 ? c.slots * c.D * 10 : 0) + (c.S + c.B * 129) * 12;
  t += c.T * c.N * c.D * half * 2 + c.T * c.N * (c.L * half + f32) + c.max_s * c.D * half * 2 + c.max_qs * c.N * 24;
  t += c.T * c.N * (c.P + c.R) * half + c.T * c.N * (c.V * half + f32);
  if (!opt.device_inputs) t += c.S_pre1 * c.kv_row;
  if (opt.prefill_op) t += c.S * c.kv_row;
  return t;
}

// The largest backend call (sequential in a worker):
// - a decode of every token (cuda.ref and cuda.splitkv route prefills
//   through decode): q_lat and q_pe (and FlashMLA's packed copy), the
//   guarded o_lat and lse, and the split partials [splits, T * N, L + 1]
//   fp32: forced ones, or the kernels' own (cuda.splitkv, FlashMLA and FA3
//   split only while the rows fill less than about two waves of the SMs:
//   at most 65536 rows beyond the unsplit ones; forced ones that would take
//   more than a quarter of the device are declined, as cuda.splitkv does);
// - a prefill call: q, K and V uploaded by the backend (FA3 without the
//   staging, cuda.ref's prefill op: every token's), the guarded o and lse,
//   and FA3's lse in [N, T].
double largest_call_bytes(const CaseTerms& c, const DeviceEstimateOptions& opt) {
  const double rows = c.T * c.N;
  double partials = (rows + 65536) * (c.L + 1) * f32;
  if (opt.forced_splits > 0) {
    const double forced = opt.forced_splits * rows * (c.L + 1) * f32;
    partials = opt.device_bytes > 0 ? std::min(forced, std::max(partials, opt.device_bytes / 4.0)) : forced;
  }
  const double decode = rows * c.D * half * 2 + rows * (c.L * half + f32) + partials;
  const double prefill_kv = opt.prefill_op ? c.S * c.kv_row : c.S_pre1 * c.kv_row;
  const double prefill = c.T * c.N * (c.P + c.R) * half + prefill_kv + c.T * c.N * (c.V * half + f32 * 2);
  return std::max(decode, prefill);
}

}  // namespace

std::uint64_t estimate_case_device_bytes(const CaseSpec& spec, const DeviceEstimateOptions& opt) {
  // Small buffers (metadata, row groups, block-table rows, scheduler plans,
  // FlashInfer's 8 MiB + ~35 MiB workspaces) and cudaMalloc's rounding of
  // each to its granule.
  const double fixed = 256 * kMiB;
  if (spec.merge.active()) return static_cast<std::uint64_t>((merge_device_bytes(spec) * 1.25) + fixed);

  const CaseTerms c(spec);
  // Each term is added to the running total on its own, in this order:
  // grouping them otherwise would round the sum differently.
  double bytes = shared_device_bytes(c, opt);
  if (spec.sparse.active()) {
    bytes += sparse_call_bytes(c);
    return static_cast<std::uint64_t>(bytes * 1.25 + fixed);
  }
  // The glue's K and V lent in device memory to backends that read them there
  // (reference/device_staging.h, harness/run/layer.h): kept copies of each
  // prefill call's K and V (every prefill row, once for the routing of
  // threshold 1 and once for FA3's 512; at most 16 GiB), and two scratch
  // slots that grow to the largest call and stay.
  if (opt.device_inputs) bytes += std::min(16 * kGiB, (c.S_pre1 + c.S_pre512) * c.kv_row) + c.S_pre1 * c.kv_row;
  if (opt.torch) bytes += torch_reserve_bytes(c, opt);
  bytes += largest_call_bytes(c, opt);
  return static_cast<std::uint64_t>(bytes * 1.25 + fixed);
}

std::uint64_t worker_device_overhead_bytes(bool torch) {
  // A worker's CUDA context before its first case: the driver's context
  // state, the local memory it reserves for every resident thread, and the
  // modules of the kernels it has loaded (lazily, as they are first used:
  // this binary holds FlashMLA's, FA3's and FlashInfer's where built).
  const double context = 1 * kGiB;
  // libtorch's own on top: cuBLAS/cuBLASLt workspaces and handles, cuDNN's,
  // and the modules of torch's kernels (its caching allocator's blocks are
  // the case's, in estimate_case_device_bytes).
  const double libtorch = 1 * kGiB;
  return static_cast<std::uint64_t>(context + (torch ? libtorch : 0));
}

bool runs_prefill_op(const CaseSpec& spec, const std::vector<Op>& ops) {
  return spec.takes(Op::kPrefill) && std::find(ops.begin(), ops.end(), Op::kPrefill) != ops.end();
}

void refuse_cases_beyond_host(const std::vector<CaseSpec>& cases, const std::vector<Op>& ops, std::uint64_t available) {
  if (available == 0) return;
  for (const CaseSpec& c : cases)
    if (const std::uint64_t need = estimate_case_bytes(c, runs_prefill_op(c, ops)); need > available) {
      char msg[160];
      std::snprintf(msg, sizeof msg, " needs about %.1f GiB (estimated), more than the %.1f GiB available", gib(need),
                    gib(available));
      throw InputError("case " + c.id() + msg + ": refused before allocating");
    }
}

void refuse_cases_beyond_device(const std::vector<CaseSpec>& cases, const std::vector<std::uint64_t>& case_bytes,
                                std::uint64_t worker_bytes, std::uint64_t device_bytes, const std::string& device) {
  if (device_bytes == 0) return;
  for (std::size_t i = 0; i < cases.size() && i < case_bytes.size(); ++i)
    if (const std::uint64_t need = case_bytes[i] + worker_bytes; need > device_bytes) {
      char msg[200];
      std::snprintf(msg, sizeof msg,
                    " needs about %.1f GiB of device memory (estimated: %.1f GiB for the case, %.1f GiB for its "
                    "worker), more than the %.1f GiB of ",
                    gib(need), gib(case_bytes[i]), gib(worker_bytes), gib(device_bytes));
      throw InputError("case " + cases[i].id() + msg + device + ": refused before running");
    }
}

}  // namespace mlagate
