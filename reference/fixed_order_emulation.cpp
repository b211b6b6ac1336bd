// The emulation's attention core in its fixed order on the CPU
// (sdpa_emulation.h, EmulatedAttention): plain loops over the arithmetic of
// detail/emulation_math.h, one row at a time. It is the yardstick of the GPU
// emulator (reference/cuda/attention_emulation.cu writes these bytes) and
// what tests run where there is no GPU. Compiled with -ffp-contract=off
// (reference/CMakeLists.txt): a product and a sum fused by the compiler
// would be another rounding than the GPU's.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "cases/encoding.h"
#include "reference/detail/emulation_math.h"
#include "reference/glue.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {
namespace {

using detail::emu_add;
using detail::emu_div;
using detail::emu_exp;
using detail::emu_fma;
using detail::emu_mul;
using detail::emu_round16;
using detail::emu_sub;
using detail::kEmuLanes;

// The start of key or value row j: rows[j] where the rows lie in pieces, else base + j * stride elements.
const void* row_start(const void* base, const void* const* rows, std::int64_t stride, std::int64_t j,
                      EmulatedAttention::Elem e) {
  if (rows) return rows[j];
  const std::int64_t bytes = e == EmulatedAttention::Elem::kF32 ? 4 : 2;
  return static_cast<const std::byte*>(base) + j * stride * bytes;
}

float element(const void* base, std::int64_t i, EmulatedAttention::Elem e) {
  switch (e) {
    case EmulatedAttention::Elem::kF32: return static_cast<const float*>(base)[i];
    case EmulatedAttention::Elem::kBF16: return bf16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case EmulatedAttention::Elem::kF16: return f16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
  }
  return 0;
}

void one(const EmulatedAttention& a) {
  if (a.rows < 0 || a.heads < 1 || a.rows_per_token < 1 || a.keys < 0 || a.dqk < 1 || a.dv < 1)
    throw std::invalid_argument("emulate_attention_fixed_order: bad dimensions");
  const std::int64_t units = std::int64_t{a.rows} * a.heads;
#pragma omp parallel
  {
    std::vector<float> x, p;
#pragma omp for schedule(dynamic, 4)
    for (std::int64_t u = 0; u < units; ++u) {
      const int r = static_cast<int>(u / a.heads), h = static_cast<int>(u % a.heads);
      const int n = detail::emu_visible(r, a.rows_per_token, a.context, a.keys);
      float* o = a.o + u * a.dv;
      if (n == 0) {
        for (int c = 0; c < a.dv; ++c) o[c] = 0;
        a.max[u] = -std::numeric_limits<float>::infinity();
        a.sum[u] = 0;
        continue;
      }
      const std::int64_t q0 = r * a.q_row + h * a.q_head;
      x.resize(static_cast<std::size_t>(n));
      p.resize(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) {
        const void* kj = row_start(a.k, a.k_rows, a.k_row, j, a.elem);
        const std::int64_t k0 = h * a.k_head;
        float s = 0.0f;
        for (int d = 0; d < a.dqk; ++d) s = emu_fma(element(a.q, q0 + d, a.elem), element(kj, k0 + d, a.elem), s);
        x[static_cast<std::size_t>(j)] = emu_mul(s, a.scale);
      }
      float lane[kEmuLanes];
      for (int l = 0; l < kEmuLanes; ++l) lane[l] = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < n; ++j) lane[j % kEmuLanes] = detail::emu_max2(lane[j % kEmuLanes], x[static_cast<std::size_t>(j)]);
      const float m = detail::emu_combine_lanes(lane, detail::emu_max2);
      for (int l = 0; l < kEmuLanes; ++l) lane[l] = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float e = emu_exp(emu_sub(x[static_cast<std::size_t>(j)], m));
        lane[j % kEmuLanes] = emu_add(lane[j % kEmuLanes], e);
        p[static_cast<std::size_t>(j)] = emu_round16(e, a.bf16);
      }
      const float sum = detail::emu_combine_lanes(lane, emu_add);
      a.max[u] = m;
      a.sum[u] = sum;
      for (int c = 0; c < a.dv; ++c) {
        float acc = 0.0f;
        for (int j = 0; j < n; ++j)
          acc = emu_fma(p[static_cast<std::size_t>(j)],
                        element(row_start(a.v, a.v_rows, a.v_row, j, a.elem), h * a.v_head + c, a.elem), acc);
        o[c] = sum == 0 ? 0.0f : emu_round16(emu_div(acc, sum), a.bf16);
      }
    }
  }
}

}  // namespace

EmulatedAttention with_projected_kv(const EmulatedAttention& a, Tensor& k, Tensor& v) {
  if (!a.latent || !a.weights_of) throw std::invalid_argument("attention emulation: no keys and no latent rows");
  // K [keys, N, P+R] and V [keys, N, V] from the latent rows, as the glue
  // projects them, read in that layout whatever the call said.
  const Case& c = *a.weights_of;
  const Dims& d = c.spec.dims;
  const int N = static_cast<int>(c.spec.num_heads()), QW = d.nope_dim + d.rope_dim;
  if (a.heads != N || a.dqk != QW || a.dv != d.v_head_dim)
    throw std::invalid_argument("attention emulation: latent rows of another shape than the call's");
  up_project_kv(c, TensorView{c.spec.dtype, {a.keys, d.kv_lora_rank}, const_cast<std::uint16_t*>(a.latent)},
                TensorView{c.spec.dtype, {a.keys, d.rope_dim}, const_cast<std::uint16_t*>(a.rope)}, k, v);
  EmulatedAttention b = a;
  b.k = k.bytes();
  b.v = v.bytes();
  b.k_rows = b.v_rows = nullptr;
  b.k_row = std::int64_t{N} * QW, b.k_head = QW;
  b.v_row = std::int64_t{N} * d.v_head_dim, b.v_head = d.v_head_dim;
  b.elem = c.spec.dtype == DType::kBF16 ? EmulatedAttention::Elem::kBF16 : EmulatedAttention::Elem::kF16;
  return b;
}

void emulate_attention_fixed_order(std::span<const EmulatedAttention> calls) {
  for (const EmulatedAttention& a : calls) {
    if (a.keys == 0 || ((a.k || a.k_rows) && (a.v || a.v_rows))) {
      one(a);
      continue;
    }
    Tensor k, v;
    one(with_projected_kv(a, k, v));
  }
}

}  // namespace mlagate
