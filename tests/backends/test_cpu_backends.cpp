// Kernel-level tests of the CPU backends against the fp64 reference, their
// invariants (block size, split count, empty rows, determinism), and proof
// that every planted bug changes cpu.paged's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cpu/attention_core.h"
#include "backends/cpu/cpu_backends.h"
#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "cases/paged_cache.h"
#include "reference/fp64_reference.h"
#include "tests/backends/planted.h"

namespace mlagate {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// bf16 data of unit scale: o_lat is an average of N(0,1) latents, its bf16
// rounding error is < 2^-9 relative; 1e-2 of the output's scale (at least 1)
// leaves room for the fp32 accumulation and the rounded P, while a 1% scale
// error or a wrong key fails.
constexpr double kOutTol = 1e-2;
// lse is fp32 from fp32 logits of the same rounded inputs as the reference.
constexpr double kLseTol = 1e-3;

CaseSpec make_spec(std::vector<int> seq_lens, std::vector<int> query_lens, int heads = 16,
                   DType dtype = DType::kBF16, std::uint64_t seed = 7) {
  CaseSpec s;
  s.suite = "test";
  s.batch.name = "backends";
  s.batch.seq_lens = std::move(seq_lens);
  s.batch.query_lens = std::move(query_lens);
  s.total_heads = heads;
  s.tp = 1;
  s.dtype = dtype;
  s.seed = seed;
  return s;
}

// The decode op's inputs: q_lat = q_nope W_UK^T computed in fp64 and rounded
// to the model dtype (what a layer hands its decode kernel), and q_pe.
struct DecodeInputs {
  Tensor q_lat;  // [T, N, L]
  Tensor q_pe;   // [T, N, R]
};

DecodeInputs absorb(const Case& c) {
  const Dims& d = c.spec.dims;
  const std::int64_t t_n = static_cast<std::int64_t>(c.num_tokens) * c.spec.num_heads();
  const int n_heads = c.spec.num_heads(), l = d.kv_lora_rank, p = d.nope_dim, r = d.rope_dim;
  const std::vector<double> q = c.q.to_f64();
  const std::vector<double> w = c.w_uk.to_f64();
  DecodeInputs in{Tensor(c.spec.dtype, {c.num_tokens, n_heads, l}), Tensor(c.spec.dtype, {c.num_tokens, n_heads, r})};
  for (std::int64_t row = 0; row < t_n; ++row) {
    const int h = static_cast<int>(row % n_heads);
    const double* qn = q.data() + row * (p + r);
    for (int j = 0; j < l; ++j) {
      const double* wr = w.data() + (static_cast<std::int64_t>(j) * n_heads + h) * p;
      double acc = 0;
      for (int k = 0; k < p; ++k) acc += qn[k] * wr[k];
      in.q_lat.set(row * l + j, acc);
    }
    for (int k = 0; k < r; ++k) in.q_pe.set(row * r + k, qn[p + k]);
  }
  return in;
}

struct Outputs {
  Tensor o;    // [T, N, W] model dtype
  Tensor lse;  // [T, N] float32
};

Outputs run_decode(Backend& be, const Case& c, const DecodeInputs& in, const PagedCache& cache) {
  const Dims& d = c.spec.dims;
  const int n = c.spec.num_heads();
  Outputs out{Tensor(c.spec.dtype, {c.num_tokens, n, d.kv_lora_rank}), Tensor(DType::kF32, {c.num_tokens, n})};
  std::vector<std::int32_t> rows(static_cast<std::size_t>(c.num_requests));
  std::iota(rows.begin(), rows.end(), 0);
  DecodeArgs a;
  a.q_lat = in.q_lat.view();
  a.q_pe = in.q_pe.view();
  a.cache = &cache;
  a.seq_lens = c.seq_lens;
  a.query_start_loc = c.query_start_loc;
  a.block_table_rows = rows;
  a.scale = c.spec.softmax_scale();
  a.k_scale = c.spec.k_scale;
  a.o_lat = out.o.view();
  a.lse = out.lse.view();
  be.decode(a);
  return out;
}

Outputs run_decode(Backend& be, const Case& c, int block_size) {
  const PagedCache cache = build_paged_cache(c, block_size, CacheOptions{});
  return run_decode(be, c, absorb(c), cache);
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

bool has_nan(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(t.get(i))) return true;
  return false;
}

// Largest |a - b|; infinities must match exactly and NaN never matches.
double max_abs_diff(const Tensor& a, const std::vector<double>& b) {
  EXPECT_EQ(a.numel(), static_cast<std::int64_t>(b.size()));
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b[static_cast<std::size_t>(i)];
    if (std::isnan(x) || std::isnan(y)) return kInf;
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return kInf;
      continue;
    }
    worst = std::max(worst, std::abs(x - y));
  }
  return worst;
}

std::vector<double> to_f64(const Tensor& t) { return t.to_f64(); }

// kOutTol at the scale of the reference (peaked softmaxes return single
// latents of magnitude ~3, whose bf16 rounding alone is ~1e-2).
double out_tol(const std::vector<double>& ref) {
  double m = 1;
  for (double x : ref)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return kOutTol * m;
}

void expect_matches_reference(Backend& be, const Case& c, int block_size) {
  const DecodeInputs in = absorb(c);
  const PagedCache cache = build_paged_cache(c, block_size, CacheOptions{});
  const Outputs out = run_decode(be, c, in, cache);
  std::vector<double> o_ref, lse_ref;
  reference_mqa(c, in.q_lat.view(), o_ref, lse_ref);
  EXPECT_LT(max_abs_diff(out.o, o_ref), out_tol(o_ref)) << be.name() << " o_lat on " << c.spec.id();
  EXPECT_LT(max_abs_diff(out.lse, lse_ref), kLseTol) << be.name() << " lse on " << c.spec.id();
}

TEST(CpuBackends, RoundToModelDtypeMatchesEncoding) {
  // The inlined bf16 rounding of P must be f32_to_bf16 bit for bit, NaN included.
  std::vector<float> x;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 65521) x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  for (std::uint32_t u : {0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FFFFFFFu, 0x3F808000u, 0x3F818000u, 0x00000001u})
    x.push_back(std::bit_cast<float>(u));
  for (DType dt : {DType::kBF16, DType::kF16}) {
    std::vector<float> y = x;
    detail::round_to_model_dtype(y.data(), static_cast<std::int64_t>(y.size()), dt);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = dt == DType::kBF16 ? bf16_to_f32(f32_to_bf16(x[i])) : f16_to_f32(f32_to_f16(x[i]));
      ASSERT_EQ(std::bit_cast<std::uint32_t>(y[i]), std::bit_cast<std::uint32_t>(want))
          << dtype_short(dt) << " input bits " << std::hex << std::bit_cast<std::uint32_t>(x[i]);
    }
  }
}

TEST(CpuBackends, DecodeMatchesReference) {
  const std::vector<CaseSpec> specs = {
      make_spec({32, 40, 1, 129}, {1, 1, 1, 1}),
      make_spec({32, 40, 48, 56}, {4, 4, 4, 4}),
      make_spec({17, 300}, {5, 5}, 16, DType::kF16),
  };
  for (const CaseSpec& s : specs) {
    const Case c = generate_case(s);
    auto paged = make_cpu_paged();
    auto split = make_cpu_splitkv();
    expect_matches_reference(*paged, c, 16);
    expect_matches_reference(*split, c, 64);
  }
}

TEST(CpuBackends, SplitKvVarlenAndManySplitsMatchReference) {
  // Varlen queries, a request longer than one 256-key split, and splits that
  // early queries see none of (partials with lse -inf in the merge).
  const Case c = generate_case(make_spec({600, 40, 9}, {3, 7, 1}));
  auto by_work = make_cpu_splitkv();
  auto many = make_cpu_splitkv_forced(37);
  expect_matches_reference(*by_work, c, 64);
  expect_matches_reference(*many, c, 16);
}

TEST(CpuBackends, SplitKvWithLargeMagnitudeQueriesMatchesReference) {
  // Peaked softmax: the partial LSEs differ by tens, which an unguarded merge overflows.
  CaseSpec s = make_spec({700, 333}, {2, 2});
  s.q_magnitude = 30;
  const Case c = generate_case(s);
  auto split = make_cpu_splitkv_forced(9);
  expect_matches_reference(*split, c, 64);
}

TEST(CpuBackends, SplitKvOneSplitIsBitIdenticalToPaged) {
  const Case c = generate_case(make_spec({32, 40, 300, 57}, {4, 4, 4, 4}));
  auto paged = make_cpu_paged();
  auto one = make_cpu_splitkv_forced(1);
  const Outputs a = run_decode(*paged, c, 16);
  const Outputs b = run_decode(*one, c, 16);
  EXPECT_TRUE(bit_identical(a.o, b.o));
  EXPECT_TRUE(bit_identical(a.lse, b.lse));
}

// One ulp of the model dtype at the largest magnitude in t: the rounding
// scale of the tensor. Per-element ulps mean nothing for elements near zero,
// whose error comes from their row's scale.
double ulp_at_scale(const Tensor& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t.get(i))) m = std::max(m, std::abs(t.get(i)));
  return std::ldexp(1.0, std::ilogb(m) - (t.dtype() == DType::kBF16 ? 7 : 10));
}

TEST(CpuBackends, SplitKvManySplitsAgreesWithPagedToRounding) {
  const Case c = generate_case(make_spec({32, 40, 300, 57}, {4, 4, 4, 4}));
  auto paged = make_cpu_paged();
  const Outputs ref = run_decode(*paged, c, 16);
  for (int splits : {2, 7, 64}) {
    auto split = make_cpu_splitkv_forced(splits);
    const Outputs out = run_decode(*split, c, 16);
    // Per-split maxima change which probabilities round up in bf16, and the
    // merge adds fp32 steps: outputs differ by about one ulp at their scale.
    EXPECT_LE(max_abs_diff(out.o, to_f64(ref.o)), 2 * ulp_at_scale(ref.o)) << splits << " splits";
    EXPECT_LT(max_abs_diff(out.lse, to_f64(ref.lse)), 1e-5) << splits << " splits";
  }
}

TEST(CpuBackends, EmptyRowGivesZeroAndMinusInfWithoutNaN) {
  // A seq_len 0 padding request between real ones (CUDA-graph padding).
  const Case c = generate_case(make_spec({33, 0, 40}, {1, 1, 1}));
  const int n = c.spec.num_heads(), l = c.spec.dims.kv_lora_rank;
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_cpu_paged());
  backends.push_back(make_cpu_splitkv());
  backends.push_back(make_cpu_splitkv_forced(5));
  for (auto& be : backends) {
    const Outputs out = run_decode(*be, c, 16);
    EXPECT_FALSE(has_nan(out.o)) << be->name();
    for (int h = 0; h < n; ++h) {
      EXPECT_EQ(out.lse.get(1 * n + h), -kInf) << be->name() << " head " << h;
      for (int j = 0; j < l; ++j) ASSERT_EQ(out.o.data<std::uint16_t>()[(1 * n + h) * l + j], 0) << be->name();
    }
    expect_matches_reference(*be, c, 16);
  }
}

TEST(CpuBackends, PagedIsBitIdenticalAcrossBlockSizes) {
  // Every block size gathers the same bytes; the block table must not matter.
  const Case c = generate_case(make_spec({32, 40, 130, 65}, {2, 2, 2, 2}));
  auto paged = make_cpu_paged();
  const Outputs ref = run_decode(*paged, c, 16);
  for (int bs : paged->capabilities().block_sizes) {
    const Outputs out = run_decode(*paged, c, bs);
    EXPECT_TRUE(bit_identical(out.o, ref.o)) << "block size " << bs;
    EXPECT_TRUE(bit_identical(out.lse, ref.lse)) << "block size " << bs;
  }
  auto split = make_cpu_splitkv();
  const Outputs split_ref = run_decode(*split, c, 64);
  for (int bs : split->capabilities().block_sizes) {
    const Outputs out = run_decode(*split, c, bs);
    EXPECT_TRUE(bit_identical(out.o, split_ref.o)) << "splitkv block size " << bs;
  }
}

TEST(CpuBackends, PoisonedBlockTableIsNeverRead) {
  const Case c = generate_case(make_spec({32, 40}, {1, 1}));
  auto paged = make_cpu_paged();
  const DecodeInputs in = absorb(c);
  CacheOptions poisoned;
  poisoned.poison_block_table = true;
  const Outputs a = run_decode(*paged, c, in, build_paged_cache(c, 16, CacheOptions{}));
  const Outputs b = run_decode(*paged, c, in, build_paged_cache(c, 16, poisoned));
  EXPECT_TRUE(bit_identical(a.o, b.o));
}

TEST(CpuBackends, RepeatedRunsAreBitIdentical) {
  const Case c = generate_case(make_spec({300, 77, 1000}, {3, 3, 3}));
  for (auto make : {make_cpu_paged, make_cpu_splitkv}) {
    auto be = make();
    const Outputs a = run_decode(*be, c, 16);
    const Outputs b = run_decode(*be, c, 16);
    EXPECT_TRUE(bit_identical(a.o, b.o)) << be->name();
    EXPECT_TRUE(bit_identical(a.lse, b.lse)) << be->name();
  }
}

TEST(CpuBackends, SupportsRefusesWithAReason) {
  auto paged = make_cpu_paged();
  auto split = make_cpu_splitkv();
  CaseSpec s = make_spec({32}, {1});
  s.block_size = 8;
  for (Backend* be : {paged.get(), split.get()}) {
    const Support sup = be->supports(s, Op::kDecode);
    EXPECT_FALSE(sup.ok) << be->name();
    EXPECT_NE(sup.reason.find('8'), std::string::npos) << sup.reason;
  }
  s.block_size = 1;
  EXPECT_TRUE(paged->supports(s, Op::kDecode).ok);
  EXPECT_FALSE(split->supports(s, Op::kDecode).ok);  // 1 is not in {64, 16, 32, 128}
  s.block_size = 0;
  EXPECT_TRUE(paged->supports(s, Op::kPrefill).ok);
  const Support no_prefill = split->supports(s, Op::kPrefill);
  EXPECT_FALSE(no_prefill.ok);
  EXPECT_FALSE(no_prefill.reason.empty());
  // cpu.paged is UNIFORM: a varlen batch is refused at kernel level.
  EXPECT_FALSE(paged->supports(make_spec({32, 40}, {1, 3}), Op::kDecode).ok);
  EXPECT_TRUE(split->supports(make_spec({32, 40}, {1, 3}), Op::kDecode).ok);
}

TEST(CpuBackends, DecodeRejectsBadArguments) {
  const Case c = generate_case(make_spec({32, 40}, {1, 1}));
  auto paged = make_cpu_paged();
  const DecodeInputs in = absorb(c);
  PagedCache cache = build_paged_cache(c, 16, CacheOptions{});
  // A block id past the cache: a GPU kernel would fault, the CPU one throws.
  cache.block_table.data<std::int32_t>()[0] = kPoisonBlockId;
  EXPECT_THROW(run_decode(*paged, c, in, cache), std::out_of_range);
  const PagedCache wrong_dtype = build_paged_cache(generate_case(make_spec({32, 40}, {1, 1}, 16, DType::kF16)), 16);
  EXPECT_THROW(run_decode(*paged, c, in, wrong_dtype), std::invalid_argument);
}

// Prefill inputs of the MHA path: k = [kv_c W_UK, k_pe], v = kv_c W_UV, per
// head, computed in fp64 and rounded to the model dtype.
struct PrefillInputs {
  Tensor k;  // [S, N, P+R]
  Tensor v;  // [S, N, V]
};

PrefillInputs up_project(const Case& c) {
  const Dims& d = c.spec.dims;
  const int n = c.spec.num_heads(), l = d.kv_lora_rank, p = d.nope_dim, r = d.rope_dim, dv = d.v_head_dim;
  const std::vector<double> kv = c.kv_c.to_f64(), pe = c.k_pe.to_f64(), wk = c.w_uk.to_f64(), wv = c.w_uv.to_f64();
  PrefillInputs in{Tensor(c.spec.dtype, {c.num_kv_tokens, n, p + r}), Tensor(c.spec.dtype, {c.num_kv_tokens, n, dv})};
  std::vector<double> acc_k(static_cast<std::size_t>(n) * p), acc_v(static_cast<std::size_t>(n) * dv);
  for (int j = 0; j < c.num_kv_tokens; ++j) {
    std::fill(acc_k.begin(), acc_k.end(), 0.0);
    std::fill(acc_v.begin(), acc_v.end(), 0.0);
    for (int m = 0; m < l; ++m) {
      const double x = kv[static_cast<std::size_t>(j) * l + m];
      const double* wkr = wk.data() + static_cast<std::size_t>(m) * n * p;
      const double* wvr = wv.data() + static_cast<std::size_t>(m) * n * dv;
      for (std::size_t i = 0; i < acc_k.size(); ++i) acc_k[i] += x * wkr[i];
      for (std::size_t i = 0; i < acc_v.size(); ++i) acc_v[i] += x * wvr[i];
    }
    for (int h = 0; h < n; ++h) {
      const std::int64_t base = (static_cast<std::int64_t>(j) * n + h) * (p + r);
      for (int i = 0; i < p; ++i) in.k.set(base + i, acc_k[static_cast<std::size_t>(h) * p + i]);
      for (int i = 0; i < r; ++i) in.k.set(base + p + i, pe[static_cast<std::size_t>(j) * r + i]);
      for (int i = 0; i < dv; ++i)
        in.v.set((static_cast<std::int64_t>(j) * n + h) * dv + i, acc_v[static_cast<std::size_t>(h) * dv + i]);
    }
  }
  return in;
}

Outputs run_prefill(Backend& be, const Case& c, const PrefillInputs& in, bool causal) {
  const int n = c.spec.num_heads();
  Outputs out{Tensor(c.spec.dtype, {c.num_tokens, n, c.spec.dims.v_head_dim}), Tensor(DType::kF32, {c.num_tokens, n})};
  PrefillArgs a;
  a.q = c.q.view();
  a.k = in.k.view();
  a.v = in.v.view();
  a.cu_seqlens_q = c.query_start_loc;
  a.cu_seqlens_k = c.kv_start_loc;
  a.causal = causal;
  a.scale = c.spec.softmax_scale();
  a.o = out.o.view();
  a.lse = out.lse.view();
  be.prefill(a);
  return out;
}

// Plain fp64 attention over the same rounded q, k, v the kernel reads.
void reference_prefill(const Case& c, const PrefillInputs& in, bool causal, std::vector<double>& o,
                       std::vector<double>& lse) {
  const int n = c.spec.num_heads(), dqk = c.spec.dims.nope_dim + c.spec.dims.rope_dim, dv = c.spec.dims.v_head_dim;
  const std::vector<double> q = c.q.to_f64(), k = in.k.to_f64(), v = in.v.to_f64();
  const double scale = c.spec.softmax_scale();
  o.assign(static_cast<std::size_t>(c.num_tokens) * n * dv, 0.0);
  lse.assign(static_cast<std::size_t>(c.num_tokens) * n, -kInf);
  for (int b = 0; b < c.num_requests; ++b) {
    const int q0 = c.query_start_loc[b], q_len = c.query_lens[b], k0 = c.kv_start_loc[b], k_len = c.seq_lens[b];
    for (int u = 0; u < q_len; ++u) {
      const int vis = causal ? detail::visible_keys(k_len, q_len, u) : k_len;
      for (int h = 0; h < n; ++h) {
        const std::size_t row = static_cast<std::size_t>(q0 + u) * n + h;
        std::vector<double> logit(static_cast<std::size_t>(vis));
        double m = -kInf;
        for (int j = 0; j < vis; ++j) {
          double dot = 0;
          for (int i = 0; i < dqk; ++i) dot += q[row * dqk + i] * k[(static_cast<std::size_t>(k0 + j) * n + h) * dqk + i];
          logit[j] = scale * dot;
          m = std::max(m, logit[j]);
        }
        if (vis == 0) continue;
        double sum = 0;
        for (int j = 0; j < vis; ++j) sum += std::exp(logit[j] - m);
        for (int j = 0; j < vis; ++j) {
          const double w = std::exp(logit[j] - m) / sum;
          for (int i = 0; i < dv; ++i) o[row * dv + i] += w * v[(static_cast<std::size_t>(k0 + j) * n + h) * dv + i];
        }
        lse[row] = m + std::log(sum);
      }
    }
  }
}

TEST(CpuBackends, PrefillMatchesReference) {
  const Case c = generate_case(make_spec({40, 8, 70}, {8, 8, 30}, 8));
  const PrefillInputs in = up_project(c);
  auto paged = make_cpu_paged();
  for (bool causal : {true, false}) {
    const Outputs out = run_prefill(*paged, c, in, causal);
    std::vector<double> o_ref, lse_ref;
    reference_prefill(c, in, causal, o_ref, lse_ref);
    EXPECT_LT(max_abs_diff(out.o, o_ref), out_tol(o_ref)) << "causal " << causal;
    EXPECT_LT(max_abs_diff(out.lse, lse_ref), kLseTol) << "causal " << causal;
  }
  // The causal prefill op over whole requests is the reference MHA path; the
  // golden up-projects in fp64 without rounding k and v, hence the looser lse bound.
  const ReferenceOutputs g = reference_mha(c);
  const Outputs out = run_prefill(*paged, c, in, true);
  EXPECT_LT(max_abs_diff(out.o, g.out), out_tol(g.out));
  EXPECT_LT(max_abs_diff(out.lse, g.lse), 1e-2);
}

TEST(CpuBackends, PrefillWithNoVisibleKeyGivesZeroAndMinusInf) {
  // cu_seqlens_k with an empty request: its queries see nothing (causal or not).
  const Case c = generate_case(make_spec({40, 8}, {8, 8}, 8));
  const PrefillInputs in = up_project(c);
  auto paged = make_cpu_paged();
  const int n = c.spec.num_heads();
  const int dv = c.spec.dims.v_head_dim;
  Outputs out{Tensor(c.spec.dtype, {c.num_tokens, n, dv}), Tensor(DType::kF32, {c.num_tokens, n})};
  const std::vector<std::int32_t> cu_k = {0, 40, 40};
  PrefillArgs a;
  a.q = c.q.view();
  a.k = TensorView{in.k.dtype(), {40, n, in.k.dim(2)}, const_cast<std::byte*>(in.k.bytes())};
  a.v = TensorView{in.v.dtype(), {40, n, dv}, const_cast<std::byte*>(in.v.bytes())};
  a.cu_seqlens_q = c.query_start_loc;
  a.cu_seqlens_k = cu_k;
  a.causal = false;
  a.scale = c.spec.softmax_scale();
  a.o = out.o.view();
  a.lse = out.lse.view();
  paged->prefill(a);
  EXPECT_FALSE(has_nan(out.o));
  for (int t = 8; t < 16; ++t) {
    for (int h = 0; h < n; ++h) {
      EXPECT_EQ(out.lse.get(t * n + h), -kInf);
      for (int i = 0; i < dv; ++i) ASSERT_EQ(out.o.get((static_cast<std::int64_t>(t) * n + h) * dv + i), 0.0);
    }
  }
}

TEST(PlantedBugs, AreNamedAndKeepCpuPagedCapabilities) {
  const Capabilities want = make_cpu_paged()->capabilities();
  std::vector<std::string> names;
  for (const PlantedBug& bug : planted_bugs()) {
    auto be = bug.make();
    EXPECT_EQ(be->name(), bug.name);
    EXPECT_EQ(bug.name.rfind("bug.", 0), 0u) << bug.name;
    EXPECT_FALSE(bug.description.empty());
    EXPECT_TRUE(bug.expected == Status::kIncorrect || bug.expected == Status::kNonfinite) << bug.name;
    const Capabilities caps = be->capabilities();
    EXPECT_EQ(caps.ops, want.ops) << bug.name;
    EXPECT_EQ(caps.block_sizes, want.block_sizes) << bug.name;
    EXPECT_EQ(caps.query_len_support, want.query_len_support) << bug.name;
    EXPECT_EQ(caps.reorder_threshold, want.reorder_threshold) << bug.name;
    EXPECT_EQ(caps.dtypes, want.dtypes) << bug.name;
    EXPECT_EQ(caps.kv_dtypes, want.kv_dtypes) << bug.name;
    names.push_back(bug.name);
  }
  EXPECT_EQ(names.size(), 7u);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

TEST(PlantedBugs, EachChangesTheDecodeOutput) {
  // Several tokens per request: the causal and lse-axis bugs only show with T > 1.
  const Case c = generate_case(make_spec({40, 57}, {4, 4}));
  const DecodeInputs in = absorb(c);
  const PagedCache cache = build_paged_cache(c, 16, CacheOptions{});
  auto paged = make_cpu_paged();
  const Outputs good = run_decode(*paged, c, in, cache);
  ASSERT_FALSE(has_nan(good.o));
  // The softmax without max subtraction needs logits past ~88.7: Q magnitude 128.
  CaseSpec large_spec = make_spec({40, 57}, {4, 4});
  large_spec.q_magnitude = 128;
  const Case large = generate_case(large_spec);
  const DecodeInputs large_in = absorb(large);
  const PagedCache large_cache = build_paged_cache(large, 16, CacheOptions{});
  const Outputs large_good = run_decode(*paged, large, large_in, large_cache);
  ASSERT_FALSE(has_nan(large_good.o));
  for (const PlantedBug& bug : planted_bugs()) {
    auto be = bug.make();
    const bool needs_large = bug.name == "bug.softmax_without_max";
    const Outputs out = needs_large ? run_decode(*be, large, large_in, large_cache) : run_decode(*be, c, in, cache);
    const Outputs& want = needs_large ? large_good : good;
    EXPECT_FALSE(bit_identical(out.o, want.o) && bit_identical(out.lse, want.lse)) << bug.name;
    EXPECT_EQ(has_nan(out.o), bug.expected == Status::kNonfinite) << bug.name;
  }
}

TEST(PlantedBugs, OutputBugsAlsoChangeThePrefillOutput) {
  const Case c = generate_case(make_spec({12, 9}, {4, 4}, 8));
  const PrefillInputs in = up_project(c);
  auto paged = make_cpu_paged();
  const Outputs good = run_prefill(*paged, c, in, true);
  for (const PlantedBug& bug : planted_bugs()) {
    if (bug.name == "bug.null_block_last_token") continue;  // prefill reads no cache
    if (bug.name == "bug.softmax_without_max") continue;    // planted in decode's softmax only
    auto be = bug.make();
    const Outputs out = run_prefill(*be, c, in, true);
    EXPECT_FALSE(bit_identical(out.o, good.o) && bit_identical(out.lse, good.lse)) << bug.name;
  }
}

// fp8 caches (SPEC: KV cache dtypes). Every fp8 format with a k_scale of 1 (many
// bf16 values tie in e4m3), 3 (divisions), and 0.01 (values beyond 240 and 448).
struct Fp8Format {
  KvCacheDtype dtype;
  ScaleRule rule;
  float k_scale;
};
const Fp8Format kFp8Formats[] = {
    {KvCacheDtype::kFp8, ScaleRule::kPow2, 1.f},       {KvCacheDtype::kFp8, ScaleRule::kPow2, 3.f},
    {KvCacheDtype::kFp8, ScaleRule::kPow2, 0.01f},     {KvCacheDtype::kFp8E4m3, ScaleRule::kPow2, 3.f},
    {KvCacheDtype::kFp8DsMla, ScaleRule::kPow2, 1.f},  {KvCacheDtype::kFp8DsMla, ScaleRule::kRaw, 1.f},
    {KvCacheDtype::kFp8DsMla, ScaleRule::kRaw, 3.f},
};

CaseSpec fp8_spec(const Fp8Format& f, std::vector<int> seq_lens, std::vector<int> query_lens, DType dt = DType::kBF16) {
  CaseSpec s = make_spec(std::move(seq_lens), std::move(query_lens), 16, dt);
  s.kv_cache_dtype = f.dtype;
  s.scale_rule = f.rule;
  s.k_scale = f.k_scale;
  return s;
}

// Every token of the case written into an empty cache by `be` and by the
// reference writer: the two caches, byte for byte.
bool writes_like_reference(Backend& be, const Case& c, int block_size, std::string* where = nullptr) {
  CacheOptions opt;
  opt.write_new_tokens = false;
  const PagedCache base = build_paged_cache(c, block_size, opt);
  PagedCache got = base, want = base;
  std::vector<std::int64_t> slots;
  for (int i = 0; i < c.num_requests; ++i)
    for (int p = 0; p < c.seq_lens[i]; ++p) slots.push_back(base.slot_of(i, p));
  reference_cache_write(want, c.kv_c.view(), c.k_pe.view(), slots);
  be.cache_write(got, c.kv_c.view(), c.k_pe.view(), slots);
  const std::string diff = first_cache_difference(got, want, {}, c.query_start_loc);
  if (where) *where = diff;
  return diff.empty();
}

// DeepSeek V4's fp8_v4 cache is the sparse backends' (the runner never gives
// it to the dense writer, by capabilities): called directly, the dense writer
// refuses it by name instead of failing on a byte count.
TEST(CpuBackendsFp8, TheDenseWriterRefusesTheV4Cache) {
  const std::vector<CaseSpec> v4 = load_suite("v4").cases;
  const auto it = std::find_if(v4.begin(), v4.end(), [](const CaseSpec& s) { return s.kv_cache_dtype == KvCacheDtype::kFp8V4; });
  ASSERT_NE(it, v4.end());
  const Case c = generate_case(*it);
  CacheOptions opt;
  opt.write_new_tokens = false;
  PagedCache cache = build_paged_cache(c, 64, opt);
  const std::vector<std::int64_t> slots{cache.slot_of(0, 0)};
  TensorView kv = c.kv_c.view(), pe = c.k_pe.view();  // the first token's rows
  kv.shape = {1, kv.shape.at(1)};
  pe.shape = {1, pe.shape.at(1)};
  try {
    make_cpu_paged()->cache_write(cache, kv, pe, slots);
    ADD_FAILURE() << "the dense writer wrote an fp8_v4 cache";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_v4"), std::string::npos) << e.what();
  }
}

TEST(CpuBackendsFp8, PagedCacheWriteIsBitExactForEveryFormat) {
  auto paged = make_cpu_paged();
  for (const Fp8Format& f : kFp8Formats) {
    const Case c = generate_case(fp8_spec(f, {300, 41, 1}, {1, 1, 1}));
    std::string where;
    EXPECT_TRUE(writes_like_reference(*paged, c, 16, &where)) << c.spec.id() << ": " << where;
  }
  const Case h = generate_case(fp8_spec(kFp8Formats[1], {77}, {1}, DType::kF16));
  EXPECT_TRUE(writes_like_reference(*paged, h, 32)) << h.spec.id();
  const Case a = generate_case(make_spec({50}, {1}, 16, DType::kF16));
  EXPECT_TRUE(writes_like_reference(*paged, a, 16)) << "auto";
}

// Both backends dequantize on load: against the reference over the
// dequantized cache they are as close as on an auto cache.
TEST(CpuBackendsFp8, DecodeMatchesReferenceOverTheDequantizedCache) {
  for (const Fp8Format& f : kFp8Formats) {
    const Case c = generate_case(fp8_spec(f, {32, 300, 1, 129}, {1, 2, 1, 1}));
    auto paged = make_cpu_paged();
    auto split = make_cpu_splitkv_forced(3);
    expect_matches_reference(*paged, c, 16);
    expect_matches_reference(*split, c, 64);
  }
  const Case h = generate_case(fp8_spec(kFp8Formats[3], {40, 9}, {1, 1}, DType::kF16));
  auto paged = make_cpu_paged();
  expect_matches_reference(*paged, h, 32);
}

TEST(PlantedFp8Bugs, EachChangesItsOwnPartOnExposingCasesOnly) {
  ASSERT_EQ(planted_fp8_bugs().size(), 5u);
  auto paged = make_cpu_paged();
  for (const PlantedBug& bug : planted_fp8_bugs()) {
    auto be = bug.make();
    EXPECT_EQ(be->name(), bug.name);
    EXPECT_EQ(be->capabilities().kv_dtypes, paged->capabilities().kv_dtypes);
    const bool writer = bug.name.find("writer") != std::string::npos;
    for (const Fp8Format& f : kFp8Formats) {
      const Case c = generate_case(fp8_spec(f, {40, 57}, {1, 1}));
      const bool exposed = bug.exposed_by(c.spec);
      SCOPED_TRACE(bug.name + " on " + c.spec.id() + (exposed ? " (exposed)" : ""));
      // A writer bug changes the bytes written; a reader bug the decode output.
      EXPECT_EQ(writes_like_reference(*be, c, 16), !(writer && exposed));
      const DecodeInputs in = absorb(c);
      const PagedCache cache = build_paged_cache(c, 16, CacheOptions{});
      const Outputs good = run_decode(*paged, c, in, cache), out = run_decode(*be, c, in, cache);
      EXPECT_EQ(bit_identical(out.o, good.o), writer || !exposed);
    }
  }
}

}  // namespace
}  // namespace mlagate
