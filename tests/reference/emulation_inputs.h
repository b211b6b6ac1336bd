// What the emulation tests share (tests/reference and tests/device): the cases
// whose every form and op they emulate, one case's inputs to the kernel-level
// ops (absorbed queries, the up-projection of every request), and random
// attention problems with the comparison of two emulators' outputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/suite.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"

namespace mlagate::test {

inline std::vector<int> all_requests(const Case& c) {
  std::vector<int> r(static_cast<std::size_t>(c.num_requests));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// Every smoke case, and mixed_small with fp8 caches whose rounded keys are
// inexact (k_scale 0.01: the decode path's second implementation runs too).
inline std::vector<CaseSpec> emulation_specs() {
  std::vector<CaseSpec> specs = load_suite("smoke").cases;
  for (const char* format : {"fp8_ds_mla:raw", "fp8"}) {
    CaseSpec spec;
    spec.batch = find_batch_spec("mixed_small");
    spec.tp = 16;
    spec.kv_cache_dtype = parse_kv_cache_format(format).dtype;
    spec.scale_rule = parse_kv_cache_format(format).scale_rule;
    spec.k_scale = 0.01f;
    specs.push_back(spec);
  }
  return specs;
}

// The decode op's queries (every token absorbed) and the prefill op's K and V
// (every request projected) of one case.
struct OpInputs {
  Tensor q_lat, q_pe;
  KvProjection projection;
  explicit OpInputs(const Case& c) : projection(c) {
    std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
    std::iota(tokens.begin(), tokens.end(), 0);
    absorb_queries(c, tokens, q_lat, q_pe);
    projection.ensure(all_requests(c));
  }
};

// Empty when equal bit for bit. Any NaN equals any NaN unless `payloads`:
// they are not promised between the GPU and the CPU, but are between the
// CPU's two implementations.
template <class T>
std::string difference(const std::vector<T>& a, const std::vector<T>& b, bool payloads = false) {
  if (a.size() != b.size()) return "sizes differ";
  std::size_t differ = 0, first = a.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool bytes = std::memcmp(&a[i], &b[i], sizeof(T)) == 0;
    const bool same = !payloads && std::isnan(a[i]) ? std::isnan(b[i]) : bytes;
    if (!same && differ++ == 0) first = i;
  }
  if (differ == 0) return {};
  char buf[200];
  std::snprintf(buf, sizeof buf, "%zu of %zu differ; first at %zu: %.9g against %.9g", differ, a.size(), first,
                static_cast<double>(a[first]), static_cast<double>(b[first]));
  return buf;
}

struct Outputs {
  std::vector<float> o, max, sum;
};
inline Outputs run(EmulatedAttention a, AttentionEmulator emulate) {
  Outputs r;
  const auto n = static_cast<std::size_t>(a.rows) * a.heads;
  r.o.assign(n * a.dv, -1.0f);
  r.max.assign(n, -1.0f);
  r.sum.assign(n, -1.0f);
  a.o = r.o.data(), a.max = r.max.data(), a.sum = r.sum.data();
  emulate({&a, 1});
  return r;
}

// One call through two emulators: the same outputs, NaN payloads too where `payloads`.
inline void expect_same_outputs(const EmulatedAttention& a, AttentionEmulator x, AttentionEmulator y,
                                bool payloads) {
  const Outputs ox = run(a, x), oy = run(a, y);
  EXPECT_EQ("", difference(ox.o, oy.o, payloads));
  EXPECT_EQ("", difference(ox.max, oy.max, payloads));
  EXPECT_EQ("", difference(ox.sum, oy.sum, payloads));
}

// Two emulations of the same form or op: the same outputs and lse, on the
// model-dtype keys and on fp32 keys, NaN payloads too where `payloads`.
inline void expect_same_results(const SdpaResult& a, const SdpaResult& b, const std::string& what,
                                bool payloads = false) {
  SCOPED_TRACE(what);
  EXPECT_EQ("", difference(a.out, b.out, payloads));
  EXPECT_EQ("", difference(a.lse, b.lse, payloads));
  EXPECT_EQ("", difference(a.out_f32_keys, b.out_f32_keys, payloads));
  EXPECT_EQ("", difference(a.lse_f32_keys, b.lse_f32_keys, payloads));
}

// Half of request 0's rows offered to `split` first, as a prefill chunk
// would, then the rest ensured: request 0's rows lie in two pieces. Returns
// the half and how many rows the offer took.
struct TwoPieces {
  std::int64_t half = 0;
  std::size_t offered = 0;
};
inline TwoPieces project_in_two_pieces(const Case& c, KvProjection& split) {
  const std::int64_t kv0 = c.kv_start_loc[0], half = c.seq_lens[0] / 2;
  if (half == 0) return {};
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  auto* kv = const_cast<std::uint16_t*>(split.kv().data<std::uint16_t>()) + kv0 * L;
  auto* pe = const_cast<std::uint16_t*>(split.pe().data<std::uint16_t>()) + kv0 * R;
  const TensorView kv_part{c.spec.dtype, {half, L}, kv}, pe_part{c.spec.dtype, {half, R}, pe};
  auto k = std::make_shared<Tensor>(), v = std::make_shared<Tensor>();
  up_project_kv(c, kv_part, pe_part, *k, *v);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(half));
  std::iota(rows.begin(), rows.end(), kv0);
  const std::size_t offered = split.offer(kv_part, pe_part, rows, k, v);
  split.ensure(all_requests(c));
  return {half, offered};
}

// A problem of random values: `heads` slices laid out [row, head, dim] (the
// prefill form's), or one slice with the values the keys' first columns (the
// decode form's).
struct Problem {
  std::vector<float> qf, kf;
  std::vector<std::uint16_t> q16, k16, v16;
  EmulatedAttention a;
};
inline Problem make(EmulatedAttention::Elem elem, int rows, int heads, int keys, int dqk, int dv, int context, float spread,
             std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, spread);
  Problem p;
  EmulatedAttention& a = p.a;
  a.elem = elem;
  a.rows = rows, a.heads = heads, a.keys = keys, a.dqk = dqk, a.dv = dv, a.context = context;
  a.rows_per_token = heads == 1 ? 4 : 1;
  a.scale = 1.0f / std::sqrt(static_cast<float>(dqk));
  a.bf16 = elem != EmulatedAttention::Elem::kF16;
  const bool f32 = elem == EmulatedAttention::Elem::kF32;
  const auto fill16 = [&](std::vector<std::uint16_t>& v, std::size_t n) {
    v.resize(n);
    for (auto& x : v) x = a.bf16 ? f32_to_bf16(nd(rng)) : f32_to_f16(nd(rng));
  };
  if (f32) {
    // The decode form: q [rows, dqk], keys [keys, dqk], values = the keys' first dv columns.
    p.qf.resize(static_cast<std::size_t>(rows) * dqk);
    p.kf.resize(static_cast<std::size_t>(std::max(keys, 1)) * dqk);
    for (auto& x : p.qf) x = bf16_to_f32(f32_to_bf16(nd(rng)));
    for (auto& x : p.kf) x = nd(rng);  // fp32 keys, not model-dtype values (the f32 key read)
    a.q = p.qf.data(), a.q_row = dqk;
    a.k = p.kf.data(), a.k_row = dqk;
    a.v = p.kf.data(), a.v_row = dqk;
  } else {
    fill16(p.q16, static_cast<std::size_t>(rows) * heads * dqk);
    fill16(p.k16, static_cast<std::size_t>(std::max(keys, 1)) * heads * dqk);
    fill16(p.v16, static_cast<std::size_t>(std::max(keys, 1)) * heads * dv);
    a.q = p.q16.data(), a.q_row = std::int64_t{heads} * dqk, a.q_head = dqk;
    a.k = p.k16.data(), a.k_row = std::int64_t{heads} * dqk, a.k_head = dqk;
    a.v = p.v16.data(), a.v_row = std::int64_t{heads} * dv, a.v_head = dv;
  }
  return p;
}

}  // namespace mlagate::test
