// The CPU emulation of the seed test's model-dtype SDPA reference: its error
// against the reference is model-dtype rounding noise (a few ulps of the output,
// never 0 on real cases), it fills exactly the requested rows, and its bits
// depend on nothing but the case (the baseline policy's err_baseline must be
// the same on every machine, thread count and backend order).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/suite.h"
#include "reference/fp64_reference.h"
#include "reference/glue.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {
namespace {

std::vector<int> all_requests(const Case& c) {
  std::vector<int> r(static_cast<std::size_t>(c.num_requests));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// Largest |a - b| over pairs where both are finite; `max_ref` gets max |b|.
double max_abs_err(const std::vector<double>& a, const std::vector<double>& b, double& max_ref) {
  double m = 0;
  max_ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    m = std::max(m, std::fabs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::fabs(b[i]));
  }
  return m;
}

TEST(SdpaEmulation, ErrorIsModelDtypeNoiseInBothForms) {
  for (const CaseSpec& spec : load_suite("smoke").cases) {
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    const ReferenceOutputs g = reference_absorbed(c);
    for (SdpaForm f : {SdpaForm::kDecode, SdpaForm::kPrefill}) {
      const SdpaResult e = emulate_sdpa_layer(c, f, all_requests(c));
      double max_ref = 0;
      const double err = max_abs_err(e.out, g.out, max_ref);
      // Output rounding alone is 0.5 ulp at max |ref|; the einsum and P roundings add a little.
      const double ulp = std::ldexp(1.0, std::ilogb(max_ref) - (spec.dtype == DType::kBF16 ? 7 : 10));
      EXPECT_GT(err, 0.1 * ulp) << sdpa_form_name(f);
      EXPECT_LT(err, 4 * ulp) << sdpa_form_name(f);
      double lse_ref = 0;
      EXPECT_LT(max_abs_err(e.lse, g.lse, lse_ref), 1e-2) << sdpa_form_name(f);
      // Empty rows (seq_len 0 padding) are 0 with lse -inf, as the reference's.
      for (std::size_t i = 0; i < g.lse.size(); ++i) {
        if (std::isinf(g.lse[i])) {
          EXPECT_EQ(e.lse[i], g.lse[i]);
        }
      }
    }
  }
}

TEST(SdpaEmulation, FillsExactlyTheRequestedRows) {
  const Case c = generate_case(load_suite("smoke").cases[2]);  // mixed_small: 4 requests
  ASSERT_EQ(c.num_requests, 4);
  const std::vector<int> some{1, 3};
  const SdpaResult part = emulate_sdpa_layer(c, SdpaForm::kPrefill, some);
  const SdpaResult whole = emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c));
  const std::size_t per_token = part.out.size() / static_cast<std::size_t>(c.num_tokens);
  for (int i = 0; i < c.num_requests; ++i) {
    const bool asked = std::find(some.begin(), some.end(), i) != some.end();
    for (int t = c.query_start_loc[i]; t < c.query_start_loc[i + 1]; ++t)
      for (std::size_t k = 0; k < per_token; ++k) {
        const double v = part.out[static_cast<std::size_t>(t) * per_token + k];
        if (asked) {
          ASSERT_EQ(v, whole.out[static_cast<std::size_t>(t) * per_token + k]);
        } else {
          ASSERT_TRUE(std::isnan(v));
        }
      }
  }
}

// A request's rows depend on it alone, not on the requests emulated with it:
// the runner emulates the requests each backend routes through a form (decode
// requests first for one backend, every request for another), export all of
// them at once, and a golden file's stored err_baseline must be the run's.
TEST(SdpaEmulation, EachRequestsBitsDoNotDependOnTheOthersEmulatedWithIt) {
  for (const char* suite : {"smoke", "vllm"}) {
    for (const CaseSpec& spec : load_suite(suite).cases) {
      if (spec.id().find("tp16") == std::string::npos && std::string(suite) == "vllm") continue;  // small enough
      if (spec.id().find("large") != std::string::npos) continue;
      const Case c = generate_case(spec);
      for (SdpaForm f : {SdpaForm::kDecode, SdpaForm::kPrefill}) {
        const SdpaResult whole = emulate_sdpa_layer(c, f, all_requests(c));
        const std::size_t per_token = whole.out.size() / static_cast<std::size_t>(c.num_tokens);
        const std::size_t heads = whole.lse.size() / static_cast<std::size_t>(c.num_tokens);
        for (int i = 0; i < c.num_requests; ++i) {
          const std::vector<int> one{i};
          const SdpaResult alone = emulate_sdpa_layer(c, f, one);
          for (std::size_t k = c.query_start_loc[i] * per_token; k < c.query_start_loc[i + 1] * per_token; ++k)
            ASSERT_EQ(std::memcmp(&alone.out[k], &whole.out[k], sizeof(double)), 0)
                << spec.id() << " form " << sdpa_form_name(f) << " request " << i << " element " << k;
          for (std::size_t k = c.query_start_loc[i] * heads; k < c.query_start_loc[i + 1] * heads; ++k)
            ASSERT_EQ(std::memcmp(&alone.lse[k], &whole.lse[k], sizeof(double)), 0)
                << spec.id() << " form " << sdpa_form_name(f) << " request " << i << " lse " << k;
        }
      }
    }
  }
}

// fp8 caches whose dequantized keys are not exact in the model dtype (raw tile
// scales, k_scale 0.01) get the decode path's second plain implementation,
// keys in fp32 (sdpa_emulation.h; cases/KV_CACHE.md, "err_baseline on inexact
// fp8 caches"), and err_baseline is the larger error of the two. Exact caches
// (auto, pow2 tile scales, k_scale 3) and the prefill form have only one. A
// request's fp32-keys rows, too, depend on it alone.
TEST(SdpaEmulation, DecodePathWithFp32KeysWhereRoundedKeysAreInexact) {
  struct Kv {
    const char* format;
    float k_scale;
    bool exact;
  };
  for (const Kv& kv : {Kv{"auto", 1.f, true}, Kv{"fp8", 3.f, true}, Kv{"fp8_ds_mla:pow2", 1.f, true},
                       Kv{"fp8_ds_mla:raw", 1.f, false}, Kv{"fp8", 0.01f, false}}) {
    SCOPED_TRACE(std::string(kv.format) + " k_scale " + std::to_string(kv.k_scale));
    CaseSpec spec;
    spec.batch = find_batch_spec("mixed_small");
    spec.tp = 16;
    spec.kv_cache_dtype = parse_kv_cache_format(kv.format).dtype;
    spec.scale_rule = parse_kv_cache_format(kv.format).scale_rule;
    spec.k_scale = kv.k_scale;
    const Case c = generate_case(spec);
    EXPECT_EQ(cache_values_exact(c), kv.exact);
    // fill_cache_values' answer (the memo) is the scan's.
    ASSERT_TRUE(c.cache_values_exact_memo.has_value());
    Case scanned = c;
    scanned.cache_values_exact_memo.reset();
    EXPECT_EQ(cache_values_exact(scanned), kv.exact);
    const ReferenceOutputs g = reference_absorbed(c);
    const SdpaResult d = emulate_sdpa_layer(c, SdpaForm::kDecode, all_requests(c));
    const SdpaResult p = emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c));
    EXPECT_TRUE(p.out_f32_keys.empty() && p.lse_f32_keys.empty());
    if (kv.exact) {
      EXPECT_TRUE(d.out_f32_keys.empty() && d.lse_f32_keys.empty());
      EXPECT_EQ(baseline_error(d, false, g.out, 0, d.out.size()), baseline_error(d.out, g.out, 0, d.out.size()));
      continue;
    }
    ASSERT_EQ(d.out_f32_keys.size(), d.out.size());
    ASSERT_EQ(d.lse_f32_keys.size(), d.lse.size());
    EXPECT_NE(d.out_f32_keys, d.out) << "the rounding of the keys changes the output";
    const double rounded = baseline_error(d.out, g.out, 0, d.out.size());
    const double f32 = baseline_error(d.out_f32_keys, g.out, 0, d.out.size());
    EXPECT_NE(rounded, f32);
    EXPECT_EQ(baseline_error(d, false, g.out, 0, d.out.size()), std::max(rounded, f32));
    EXPECT_EQ(baseline_error(d, true, g.lse, 0, d.lse.size()),
              std::max(baseline_error(d.lse, g.lse, 0, d.lse.size()), baseline_error(d.lse_f32_keys, g.lse, 0, d.lse.size())));
    const std::size_t per_token = d.out.size() / static_cast<std::size_t>(c.num_tokens);
    const std::size_t heads = d.lse.size() / static_cast<std::size_t>(c.num_tokens);
    for (int i = 0; i < c.num_requests; ++i) {
      const std::vector<int> one{i};
      const SdpaResult alone = emulate_sdpa_layer(c, SdpaForm::kDecode, one);
      for (std::size_t k = c.query_start_loc[i] * per_token; k < c.query_start_loc[i + 1] * per_token; ++k)
        ASSERT_EQ(std::memcmp(&alone.out_f32_keys[k], &d.out_f32_keys[k], sizeof(double)), 0) << i << " " << k;
      for (std::size_t k = c.query_start_loc[i] * heads; k < c.query_start_loc[i + 1] * heads; ++k)
        ASSERT_EQ(std::memcmp(&alone.lse_f32_keys[k], &d.lse_f32_keys[k], sizeof(double)), 0) << i << " " << k;
    }
    // The kernel-level decode op likewise.
    std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
    std::iota(tokens.begin(), tokens.end(), 0);
    Tensor q_lat, q_pe;
    absorb_queries(c, tokens, q_lat, q_pe);
    const SdpaResult op = emulate_sdpa_decode_op(c, q_lat.view());
    EXPECT_EQ(op.out_f32_keys.size(), op.out.size());
    EXPECT_EQ(op.lse_f32_keys.size(), op.lse.size());
  }
}

TEST(SdpaEmulation, BitsDoNotDependOnThreads) {
  const Case c = generate_case(load_suite("smoke").cases[3]);  // spec_decode_small
  const int saved = omp_get_max_threads();
  std::vector<SdpaResult> runs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (SdpaForm f : {SdpaForm::kDecode, SdpaForm::kPrefill}) runs.push_back(emulate_sdpa_layer(c, f, all_requests(c)));
  }
  omp_set_num_threads(saved);
  for (std::size_t r = 2; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].out, runs[r % 2].out);
    EXPECT_EQ(runs[r].lse, runs[r % 2].lse);
  }
}

}  // namespace
}  // namespace mlagate
