// The layer glue's up-projection on the GPU (cuda_project_rows, the row
// projector --reference cuda sets) against the CPU's row-wise GEMM, byte for
// byte: every smoke case, bf16 and fp16, fp8 caches (model-dtype latent and
// float32 latent), runs of odd lengths anywhere, values that round to
// subnormals, to zero and to inf, every rounding case of both dtypes, NaN
// positions, a TP 1 row count in many chunks; and KvProjection, LayerMemo and
// the baseline emulation give the same bits with the projector as without.
// The same for the projection made and kept in device memory
// (cuda_project_rows_on_device, the GPU staging's project).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backends.h"
#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/suite.h"
#include "harness/run/ops/layer/memo.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

// Empty when the bytes are equal, else where they first differ (as 16-bit words).
std::string first_difference(const void* a, const void* b, std::size_t bytes) {
  if (std::memcmp(a, b, bytes) == 0) return {};
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  std::size_t differ = 0, first = bytes / 2;
  for (std::size_t i = 0; i < bytes / 2; ++i)
    if (x[i] != y[i]) {
      if (first == bytes / 2) first = i;
      ++differ;
    }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu of %zu elements differ; first at %zu: gpu 0x%04x, cpu 0x%04x", differ, bytes / 2,
                first, first < bytes / 2 ? x[first] : 0u, first < bytes / 2 ? y[first] : 0u);
  return buf;
}

std::string first_difference(const Tensor& gpu, const Tensor& cpu) {
  if (gpu.shape() != cpu.shape() || gpu.dtype() != cpu.dtype()) return "shapes or dtypes differ";
  return first_difference(gpu.bytes(), cpu.bytes(), gpu.nbytes());
}

#define EXPECT_SAME_BITS(gpu, cpu) EXPECT_EQ("", first_difference(gpu, cpu))

// up_project_kv(c, kv, pe) on the CPU and on the GPU.
struct BothProjections {
  Tensor k_cpu, v_cpu, k_gpu, v_gpu;
};
BothProjections project_both(const Case& c, const TensorView& kv, const TensorView& pe) {
  BothProjections p;
  {
    const RowProjectorScope cpu(nullptr);
    up_project_kv(c, kv, pe, p.k_cpu, p.v_cpu);
  }
  {
    const RowProjectorScope gpu(cuda_project_rows);
    up_project_kv(c, kv, pe, p.k_gpu, p.v_gpu);
  }
  return p;
}

// up_project_kv(c, kv, pe) made in device memory by the GPU staging's
// projector (cuda_project_rows_on_device), brought back to compare.
std::pair<Tensor, Tensor> project_on_device(const Case& c, const TensorView& kv, const TensorView& pe) {
  const std::int64_t s = kv.shape.at(0), N = c.spec.num_heads();
  const Dims& d = c.spec.dims;
  Tensor k(c.spec.dtype, {s, N, d.nope_dim + d.rope_dim}), v(c.spec.dtype, {s, N, d.v_head_dim});
  const auto [dk, dv] = cuda_device_staging()->project(c, kv, pe);
  EXPECT_EQ(cudaSuccess, cudaMemcpy(k.bytes(), dk.get(), k.nbytes(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(cudaSuccess, cudaMemcpy(v.bytes(), dv.get(), v.nbytes(), cudaMemcpyDeviceToHost));
  return {std::move(k), std::move(v)};
}

void expect_same_projection(const Case& c, const TensorView& kv, const TensorView& pe) {
  const BothProjections p = project_both(c, kv, pe);
  EXPECT_SAME_BITS(p.k_gpu, p.k_cpu);
  EXPECT_SAME_BITS(p.v_gpu, p.v_cpu);
  const auto [k, v] = project_on_device(c, kv, pe);
  EXPECT_SAME_BITS(k, p.k_cpu);
  EXPECT_SAME_BITS(v, p.v_cpu);
}

std::vector<Case> smoke_cases(KvCacheDtype kv = KvCacheDtype::kAuto) {
  std::vector<Case> out;
  for (CaseSpec s : load_suite("smoke").cases) {
    s.kv_cache_dtype = kv;
    s.validate();
    out.push_back(generate_case(s));
  }
  return out;
}

std::vector<int> all_requests(const Case& c) {
  std::vector<int> r(static_cast<std::size_t>(c.num_requests));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// A float32 tensor of kv's values times 2^e (exact while in range).
Tensor scaled_f32(const Tensor& kv, int e) {
  Tensor out(DType::kF32, kv.shape());
  for (std::int64_t i = 0; i < kv.numel(); ++i)
    out.data<float>()[i] = std::ldexp(static_cast<float>(kv.view().get(i)), e);
  return out;
}

TEST(CudaProjection, EqualsTheCpuOnEverySmokeCase) {
  MLAGATE_REQUIRE_GPU();
  bool bf16 = false, fp16 = false;
  for (const Case& c : smoke_cases()) {
    SCOPED_TRACE(c.spec.id());
    bf16 |= c.spec.dtype == DType::kBF16;
    fp16 |= c.spec.dtype == DType::kF16;
    expect_same_projection(c, c.kv_c.view(), c.k_pe.view());
  }
  EXPECT_TRUE(bf16 && fp16);  // both model dtypes covered
}

TEST(CudaProjection, RunsOfAnyLengthAnywhere) {
  // Runs off every tile (128 rows), starting anywhere, several per call, each
  // into its own place: the bits of the CPU's projection of the same runs.
  MLAGATE_REQUIRE_GPU();
  for (const Case& c : smoke_cases()) {
    SCOPED_TRACE(c.spec.id());
    const std::int64_t S = c.num_kv_tokens, N = c.spec.num_heads(), P = c.spec.dims.nope_dim,
                       R = c.spec.dims.rope_dim, V = c.spec.dims.v_head_dim;
    std::vector<std::pair<std::int64_t, std::int64_t>> spans;  // (first, n)
    for (const auto& [first, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {0, 1}, {1, 3}, {5, 127}, {2, 129}, {S - 1, 1}, {S / 3, S - S / 3}, {0, S}, {7, 0}})
      if (first >= 0 && n >= 0 && first + n <= S) spans.emplace_back(first, n);
    std::int64_t total = 0;
    for (const auto& sp : spans) total += sp.second;
    Tensor k_cpu(c.spec.dtype, {total, N, P + R}), v_cpu(c.spec.dtype, {total, N, V});
    Tensor k_gpu(c.spec.dtype, {total, N, P + R}), v_gpu(c.spec.dtype, {total, N, V});
    std::vector<RowRun> cpu_runs, gpu_runs;
    std::int64_t at = 0;
    for (const auto& [first, n] : spans) {
      cpu_runs.push_back({first, n, k_cpu.data<std::uint16_t>() + at * N * (P + R), v_cpu.data<std::uint16_t>() + at * N * V});
      gpu_runs.push_back({first, n, k_gpu.data<std::uint16_t>() + at * N * (P + R), v_gpu.data<std::uint16_t>() + at * N * V});
      at += n;
    }
    project_rows_on_cpu(c, c.kv_c.view(), c.k_pe.view(), cpu_runs);
    cuda_project_rows(c, c.kv_c.view(), c.k_pe.view(), gpu_runs);
    EXPECT_SAME_BITS(k_gpu, k_cpu);
    EXPECT_SAME_BITS(v_gpu, v_cpu);
  }
}

TEST(CudaProjection, OddDimensionsAndHeadCounts) {
  // Depths off the 8-step (a partial last step runs only its real terms),
  // head widths off the 128-column tile (heads straddle tiles), no rope, one
  // head, rows off the 128-row tile; both model dtypes.
  MLAGATE_REQUIRE_GPU();
  const CaseSpec base = load_suite("smoke").cases.front();
  for (const auto& [dims, heads] : std::vector<std::pair<Dims, int>>{
           {Dims{37, 3, 45, 7}, 5}, {Dims{1, 0, 1, 1}, 1}, {Dims{13, 64, 200, 129}, 3}, {Dims{512, 64, 128, 128}, 1}})
    for (DType dt : {DType::kBF16, DType::kF16}) {
      CaseSpec spec = base;
      spec.dims = dims;
      spec.total_heads = heads;
      spec.tp = 1;
      spec.dtype = dt;
      spec.validate();
      SCOPED_TRACE(spec.id());
      const Case c = generate_case(spec);
      expect_same_projection(c, c.kv_c.view(), c.k_pe.view());
    }
}

TEST(CudaProjection, Fp8CachesModelDtypeAndFloatLatent) {
  // fp8 caches: KvProjection projects the dequantized latent in the model
  // dtype; the float32 values themselves take the widening of any dtype and
  // the rope's rounding (k_pe not in the model dtype).
  MLAGATE_REQUIRE_GPU();
  for (const Case& c : smoke_cases(KvCacheDtype::kFp8)) {
    SCOPED_TRACE(c.spec.id());
    ASSERT_FALSE(c.kv_c_cache.empty());
    const KvProjection p(c);
    expect_same_projection(c, p.kv().view(), p.pe().view());
    expect_same_projection(c, c.kv_c_cache.view(), c.k_pe_cache.view());
  }
}

TEST(CudaProjection, SubnormalZeroAndInfResults) {
  // The latent scaled far down (products and sums subnormal or zero in fp32:
  // a GPU that flushed subnormals would differ) and far up (fp16 results past
  // 65504 round to inf), as float32 inputs.
  MLAGATE_REQUIRE_GPU();
  for (const Case& c : smoke_cases()) {
    if (c.spec.batch.name != "mixed_small") continue;
    SCOPED_TRACE(c.spec.id());
    for (int e : {-120, -132, -140, -149, -20, -26, 16, 24, 100}) {
      SCOPED_TRACE("scale 2^" + std::to_string(e));
      const Tensor kv = scaled_f32(c.kv_c, e);
      const BothProjections p = project_both(c, kv.view(), c.k_pe.view());
      EXPECT_SAME_BITS(p.k_gpu, p.k_cpu);
      EXPECT_SAME_BITS(p.v_gpu, p.v_cpu);
    }
  }
}

// Bits of fp32 values that hit every rounding case of bf16 and fp16: ties each
// way, carries into the exponent, subnormal and overflow thresholds, signed
// zeros, infinities, and random bits of every exponent (no NaN: a NaN's bits
// after an fma are the hardware's, see NaNWhereTheCpuHasNaN).
std::vector<std::uint32_t> rounding_inputs() {
  std::vector<std::uint32_t> u = {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00800000u,
                                  0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x3F7FFFFFu, 0x7F7FFFFFu, 0x7F7F8000u,
                                  0x7F7F7FFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u, 0x477FE000u, 0x477FEFFFu,
                                  0x477FF000u, 0x477FF001u, 0x38800000u, 0x387FC000u, 0x387FE000u, 0x33000000u,
                                  0x33000001u, 0x32FFFFFFu, 0x33800000u, 0x33C00000u, 0x3F801000u, 0x3F803000u,
                                  0x3F800FFFu, 0x3F802000u, 0x3A802000u, 0x3A803000u};
  std::mt19937 rng(11);
  for (int i = 0; i < 4000; ++i) {
    std::uint32_t x = rng();
    if ((x & 0x7F800000u) == 0x7F800000u) x &= 0xBFFFFFFFu;  // no inf or NaN from random bits
    if (i % 4 == 0) x = (x & 0xFFFF0000u) | 0x8000u | (rng() % 2 ? 0x0000u : 0x0001u);  // bf16 ties and just past
    if (i % 4 == 1) x = (x & 0xFFFFE000u) | 0x1000u;                                    // fp16 normal ties
    u.push_back(x);
  }
  return u;
}

TEST(CudaProjection, RoundsEveryValueAsTheCpu) {
  // Weights with a single 1 at l = 0 (zeros elsewhere): every result is
  // round16(kv[j, 0]), so the GPU's rounding meets each value above directly.
  MLAGATE_REQUIRE_GPU();
  for (const Case& base : smoke_cases()) {
    if (base.spec.batch.name != "mixed_small") continue;  // a bf16 and an fp16 case
    SCOPED_TRACE(base.spec.id());
    Case c = base;
    const bool bf16 = c.spec.dtype == DType::kBF16;
    const std::uint16_t one = bf16 ? f32_to_bf16(1.f) : f32_to_f16(1.f);
    for (Tensor* w : {&c.w_uk, &c.w_uv}) {
      *w = Tensor(c.spec.dtype, w->shape());
      const std::int64_t cols = w->dim(1) * w->dim(2);
      std::fill_n(w->data<std::uint16_t>(), cols, one);  // row l = 0
    }
    const std::vector<std::uint32_t> values = rounding_inputs();
    const std::int64_t n = static_cast<std::int64_t>(values.size()), L = c.spec.dims.kv_lora_rank,
                       R = c.spec.dims.rope_dim;
    Tensor kv(DType::kF32, {n, L}), pe(c.spec.dtype, {n, R});
    for (std::int64_t j = 0; j < n; ++j) kv.data<float>()[j * L] = std::bit_cast<float>(values[static_cast<std::size_t>(j)]);
    const BothProjections p = project_both(c, kv.view(), pe.view());
    EXPECT_SAME_BITS(p.k_gpu, p.k_cpu);
    EXPECT_SAME_BITS(p.v_gpu, p.v_cpu);
    // And the CPU's is the rounding of the value itself (x + 0 * w... = x).
    const std::int64_t N = c.spec.num_heads(), P = c.spec.dims.nope_dim;
    for (std::int64_t j = 0; j < n; ++j) {
      const float x = std::bit_cast<float>(values[static_cast<std::size_t>(j)]);
      const std::uint16_t want = x == 0.f ? 0 : bf16 ? f32_to_bf16(x) : f32_to_f16(x);  // -0 + +0 products = +0
      ASSERT_EQ(p.k_cpu.data<std::uint16_t>()[j * N * (P + R)], want) << "value 0x" << std::hex << values[j];
    }
  }
}

TEST(CudaProjection, NaNWhereTheCpuHasNaN) {
  // A latent row with +inf and -inf (inf - inf) and one with a NaN: NaN in the
  // same places on both, every other element the same bits. A NaN's own bits
  // are the hardware's (x86 keeps an operand's payload, in an order the
  // compiler's FMA form decides, or makes a negative default NaN; the GPU
  // makes its canonical NaN), so they are not compared.
  MLAGATE_REQUIRE_GPU();
  for (const Case& c : smoke_cases()) {
    if (c.spec.batch.name != "mixed_small") continue;
    SCOPED_TRACE(c.spec.id());
    const std::int64_t L = c.spec.dims.kv_lora_rank;
    Tensor kv = scaled_f32(c.kv_c, 0);
    kv.data<float>()[1 * L + 3] = INFINITY;
    kv.data<float>()[1 * L + 9] = -INFINITY;
    kv.data<float>()[4 * L + 100] = NAN;
    kv.data<float>()[6 * L + 0] = INFINITY;  // inf results, no NaN
    const BothProjections p = project_both(c, kv.view(), c.k_pe.view());
    const bool bf16 = c.spec.dtype == DType::kBF16;
    auto is_nan = [bf16](std::uint16_t b) {
      return bf16 ? (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) : (b & 0x7C00u) == 0x7C00u && (b & 0x3FFu);
    };
    for (const auto& [g, k] : {std::pair{&p.k_gpu, &p.k_cpu}, std::pair{&p.v_gpu, &p.v_cpu}}) {
      std::int64_t nans = 0, differ = 0;
      for (std::int64_t i = 0; i < g->numel(); ++i) {
        const std::uint16_t x = g->data<std::uint16_t>()[i], y = k->data<std::uint16_t>()[i];
        ASSERT_EQ(is_nan(x), is_nan(y)) << "element " << i;
        if (is_nan(x)) ++nans;
        else differ += x != y;
      }
      EXPECT_GT(nans, 0);
      EXPECT_EQ(differ, 0);
    }
  }
}

TEST(CudaProjection, ProjectionMemoAndEmulationGiveTheSameBits) {
  // KvProjection (requests one by one, then every row), up_project_kv_known
  // (known rows copied, a damaged one projected), LayerMemo and the baseline
  // emulation's prefill form: with the GPU projector the CPU's bits.
  MLAGATE_REQUIRE_GPU();
  for (KvCacheDtype kvd : {KvCacheDtype::kAuto, KvCacheDtype::kFp8})
    for (const Case& c : smoke_cases(kvd)) {
      SCOPED_TRACE(c.spec.id());
      const std::vector<int> all = all_requests(c);
      KvProjection cpu(c), gpu(c);
      {
        const RowProjectorScope on_cpu(nullptr);
        cpu.ensure(all);
      }
      const RowProjectorScope on_gpu(cuda_project_rows);
      for (int i = c.num_requests - 1; i >= 0; i -= 2) gpu.ensure(std::vector<int>{i});
      EXPECT_SAME_BITS(gpu.k_all(), cpu.k_all());  // the other requests projected into place
      EXPECT_SAME_BITS(gpu.v_all(), cpu.v_all());
      gpu.ensure(all);
      for (std::int64_t r = 0; r < c.num_kv_tokens; ++r) {
        const std::int64_t N = c.spec.num_heads(), P = c.spec.dims.nope_dim, R = c.spec.dims.rope_dim,
                           V = c.spec.dims.v_head_dim;
        ASSERT_EQ("", first_difference(gpu.k_row(r), cpu.k_row(r), static_cast<std::size_t>(N * (P + R)) * 2)) << r;
        ASSERT_EQ("", first_difference(gpu.v_row(r), cpu.v_row(r), static_cast<std::size_t>(N * V) * 2)) << r;
      }

      // The glue's rows: request 1's then request 0's, one latent bit changed.
      std::vector<std::int64_t> rows;
      for (int i : {1, 0})
        if (i < c.num_requests)
          for (int p = 0; p < c.seq_lens[i]; ++p) rows.push_back(std::int64_t{c.kv_start_loc[i]} + p);
      const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
      const std::int64_t n = static_cast<std::int64_t>(rows.size());
      Tensor kv(c.spec.dtype, {n, L}), pe(c.spec.dtype, {n, R});
      for (std::int64_t j = 0; j < n; ++j) {
        std::memcpy(kv.bytes() + j * L * 2, cpu.kv().bytes() + rows[j] * L * 2, L * 2);
        std::memcpy(pe.bytes() + j * R * 2, cpu.pe().bytes() + rows[j] * R * 2, R * 2);
      }
      if (n > 3) kv.data<std::uint16_t>()[3 * L + 5] ^= 0x0100;
      Tensor k_ref, v_ref, k, v;
      {
        const RowProjectorScope on_cpu(nullptr);
        up_project_kv(c, kv.view(), pe.view(), k_ref, v_ref);
      }
      KvProjection fresh(c);  // no rows known: every row projected on the GPU
      for (const KvProjection* known : {static_cast<const KvProjection*>(&gpu), static_cast<const KvProjection*>(&fresh)}) {
        up_project_kv_known(c, kv.view(), pe.view(), rows, *known, k, v);
        EXPECT_SAME_BITS(k, k_ref);
        EXPECT_SAME_BITS(v, v_ref);
      }
      LayerMemo memo;
      KvProjection& offered = memo.projection(c);  // the memo's own, as the layer module's state holds it
      const auto [mk, mv] = memo.up_project(c, kv, pe, rows, &offered);
      EXPECT_SAME_BITS(*mk, k_ref);
      EXPECT_SAME_BITS(*mv, v_ref);
      offered.ensure(all);  // offered rows kept, the others projected
      EXPECT_SAME_BITS(offered.k_all(), cpu.k_all());
      EXPECT_SAME_BITS(offered.v_all(), cpu.v_all());

      // The baseline emulation's prefill form projects through KvProjection.
      SdpaResult own_cpu;
      {
        const RowProjectorScope on_cpu(nullptr);
        own_cpu = emulate_sdpa_layer(c, SdpaForm::kPrefill, all);
      }
      const SdpaResult own_gpu = emulate_sdpa_layer(c, SdpaForm::kPrefill, all);
      for (const auto& [g, k] : {std::pair{&own_gpu.out, &own_cpu.out}, std::pair{&own_gpu.lse, &own_cpu.lse}}) {
        ASSERT_EQ(g->size(), k->size());
        EXPECT_EQ(0, std::memcmp(g->data(), k->data(), k->size() * sizeof(double)));
      }
    }
}

TEST(CudaProjection, TensorParallel1RowCountInChunks) {
  // vllm's large_prefill at TP 1 (128 heads, 32,768 rows: 2.7 GB of K and V,
  // about 40 chunks of 64 MiB): up_project_kv whole, and KvProjection's runs
  // (every other request, then the rest into place) across chunk boundaries.
  MLAGATE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    CaseSpec spec;
    bool found = false;
    for (const CaseSpec& s : load_suite("vllm").cases)
      if (s.batch.name == "large_prefill" && s.tp == 1 && s.kv_cache_dtype == KvCacheDtype::kAuto) {
        spec = s;
        found = true;
        break;
      }
    ASSERT_TRUE(found);
    spec.dtype = dt;
    spec.validate();
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    ASSERT_EQ(c.spec.num_heads(), 128);
    const BothProjections p = project_both(c, c.kv_c.view(), c.k_pe.view());
    EXPECT_SAME_BITS(p.k_gpu, p.k_cpu);
    EXPECT_SAME_BITS(p.v_gpu, p.v_cpu);
    {
      // Kept in device memory: four chunks of 8,192 latent rows.
      const auto [k, v] = project_on_device(c, c.kv_c.view(), c.k_pe.view());
      EXPECT_SAME_BITS(k, p.k_cpu);
      EXPECT_SAME_BITS(v, p.v_cpu);
    }
    const RowProjectorScope on_gpu(cuda_project_rows);
    KvProjection gpu(c);
    std::vector<int> half;
    for (int i = 0; i < c.num_requests; i += 2) half.push_back(i);
    gpu.ensure(half);
    EXPECT_SAME_BITS(gpu.k_all(), p.k_cpu);
    EXPECT_SAME_BITS(gpu.v_all(), p.v_cpu);
  }
  cuda_release_row_projector();  // the pinned and device chunk buffers
}

}  // namespace
}  // namespace mlagate
