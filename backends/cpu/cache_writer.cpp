// cpu.paged's cache writer: new tokens into the paged cache in every kv cache
// dtype's layout. Deliberately its own code (e4m3 by a search over the 127
// positive codes, scales by frexp), not the reference writer's bit tricks, so
// the cache_write op compares two implementations of the same contract.
#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/cpu/attention_core.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/fp8.h"

namespace mlagate::detail {
namespace {

// The positive finite e4m3fn values, codes 0x00 .. 0x7E, increasing.
const std::array<float, 127>& e4m3_values() {
  static const std::array<float, 127> v = [] {
    std::array<float, 127> t{};
    for (int c = 0; c < 127; ++c) t[static_cast<std::size_t>(c)] = e4m3_to_f32(static_cast<std::uint8_t>(c));
    return t;
  }();
  return v;
}

std::uint8_t to_e4m3(float x, const KernelFaults& faults) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const auto& v = e4m3_values();
  const float a = std::fabs(x);
  // Saturate at the largest finite value (SATFINITE); the planted fault uses e4m3fnuz's 240 (code 0x77).
  const int top = faults.writer_saturates_240 ? 0x77 : 0x7E;
  if (a >= v[static_cast<std::size_t>(top)]) return static_cast<std::uint8_t>(sign | top);
  // v[lo] <= a < v[lo + 1]; the differences below are exact (Sterbenz: neighbours are within 2x).
  const int lo = static_cast<int>(std::upper_bound(v.begin(), v.end(), a) - v.begin()) - 1;
  if (faults.writer_truncates) return static_cast<std::uint8_t>(sign | lo);
  const float below = a - v[static_cast<std::size_t>(lo)], above = v[static_cast<std::size_t>(lo + 1)] - a;
  const int code = below < above ? lo : above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return static_cast<std::uint8_t>(sign | code);
}

float widen16(std::uint16_t bits, DType dt) { return dt == DType::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits); }

float tile_scale(float amax, ScaleRule rule) {
  const float s = amax / 448.f;
  if (rule == ScaleRule::kRaw) return s > FLT_MIN ? s : FLT_MIN;
  const float t = s > 1e-4f ? s : 1e-4f;
  int e = 0;
  const float m = std::frexp(t, &e);  // t = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? t : std::ldexp(1.f, e);
}

}  // namespace

void write_cache(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                 std::span<const std::int64_t> slots, const KernelFaults& faults) {
  const DType dt = cache.elem_dtype;
  check_model_dtype(dt, "cache_write");
  if (kv_c.dtype != dt || k_pe.dtype != dt) throw std::invalid_argument("cache_write: kv_c/k_pe must be the model dtype");
  if (kv_c.shape.size() != 2 || k_pe.shape.size() != 2)
    throw std::invalid_argument("cache_write: kv_c must be [n, L] and k_pe [n, R]");
  const int l = static_cast<int>(kv_c.shape[1]), r = static_cast<int>(k_pe.shape[1]);
  const auto n = static_cast<std::int64_t>(slots.size());
  if (kv_c.shape[0] != n || k_pe.shape[0] != n) throw std::invalid_argument("cache_write: one row per slot");
  int bytes = 0;
  switch (cache.kv_dtype) {
    case KvCacheDtype::kAuto: bytes = 2 * (l + r); break;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3: bytes = l + r; break;
    case KvCacheDtype::kFp8DsMla:
      if (l % 128 != 0 || dt != DType::kBF16) throw std::invalid_argument("cache_write: fp8_ds_mla needs L % 128 == 0 and bf16");
      bytes = l + 4 * (l / 128) + 2 * r;
      break;
    case KvCacheDtype::kFp8V4:  // the runner never asks (capabilities); cases/fp8.h encodes its entries
      throw NotSupportedError("cache_write: fp8_v4 is DeepSeek V4's sparse cache, not written by the dense writer");
  }
  if (bytes != cache.entry_bytes)
    throw std::invalid_argument("cache_write: entry of " + std::to_string(cache.entry_bytes) + " bytes, expected " +
                                std::to_string(bytes));
  const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  const auto* kv = kv_c.as<std::uint16_t>();
  const auto* pe = k_pe.as<std::uint16_t>();
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t slot = slots[static_cast<std::size_t>(t)];
    if (slot < 0) continue;
    if (slot >= capacity) throw std::out_of_range("cache_write: slot " + std::to_string(slot) + " out of range");
    auto* dst = reinterpret_cast<std::uint8_t*>(cache.entry(slot));
    const std::uint16_t* x = kv + t * l;
    const std::uint16_t* p = pe + t * r;
    switch (cache.kv_dtype) {
      case KvCacheDtype::kAuto:
        std::memcpy(dst, x, static_cast<std::size_t>(l) * 2);
        std::memcpy(dst + 2 * l, p, static_cast<std::size_t>(r) * 2);
        break;
      case KvCacheDtype::kFp8:
      case KvCacheDtype::kFp8E4m3:
        for (int i = 0; i < l; ++i) dst[i] = to_e4m3(widen16(x[i], dt) / cache.k_scale, faults);
        for (int i = 0; i < r; ++i) dst[l + i] = to_e4m3(widen16(p[i], dt) / cache.k_scale, faults);
        break;
      case KvCacheDtype::kFp8DsMla:
        for (int tile = 0; tile < l / 128; ++tile) {
          float amax = 0;
          for (int i = tile * 128; i < (tile + 1) * 128; ++i) amax = std::max(amax, std::fabs(widen16(x[i], dt)));
          const float scale = tile_scale(amax, cache.scale_rule);
          for (int i = tile * 128; i < (tile + 1) * 128; ++i) dst[i] = to_e4m3(widen16(x[i], dt) / scale, faults);
          std::memcpy(dst + l + 4 * tile, &scale, 4);
        }
        std::memcpy(dst + l + 4 * (l / 128), p, static_cast<std::size_t>(r) * 2);
        break;
      case KvCacheDtype::kFp8V4: break;  // refused above
    }
  }
}

}  // namespace mlagate::detail
