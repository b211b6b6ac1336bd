// Content hashes of golden files: FNV-1a 64 (every file, every dataset) and
// XXH64 (files written since it was added). XXH64 runs four independent
// multiply chains over 32-byte stripes, so it hashes at memory speed where
// FNV-1a, one multiply per byte in a single chain, runs at about 1 GB/s: run
// --golden checks every regenerated input and rebuilt cache (gigabytes) with
// it. Written from the published XXH64 specification (seed 0 here); the test
// vectors in tests/golden pin it, and h5py users can check with the `xxhash`
// package's xxh64.
#include <bit>
#include <cstdio>
#include <cstring>

#include "golden/detail/schema.h"
#include "golden/golden_file.h"

namespace mlagate {

std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                        kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;

// Little-endian loads whatever the host (the hash is of the file's bytes).
inline std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
inline std::uint32_t load32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
inline std::uint64_t round(std::uint64_t acc, std::uint64_t input) {
  acc += input * kP2;
  acc = std::rotl(acc, 31);
  return acc * kP1;
}
inline std::uint64_t merge_round(std::uint64_t acc, std::uint64_t v) {
  acc ^= round(0, v);
  return acc * kP1 + kP4;
}

}  // namespace

std::uint64_t xxh64(const void* data, std::size_t n, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + n;
  std::uint64_t h;
  if (n >= 32) {
    std::uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    for (; end - p >= 32; p += 32) {
      v1 = round(v1, load64(p));
      v2 = round(v2, load64(p + 8));
      v3 = round(v3, load64(p + 16));
      v4 = round(v4, load64(p + 24));
    }
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = merge_round(h, v1);
    h = merge_round(h, v2);
    h = merge_round(h, v3);
    h = merge_round(h, v4);
  } else {
    h = seed + kP5;
  }
  h += static_cast<std::uint64_t>(n);
  for (; end - p >= 8; p += 8) h = std::rotl(h ^ round(0, load64(p)), 27) * kP1 + kP4;
  if (end - p >= 4) {
    h = std::rotl(h ^ (static_cast<std::uint64_t>(load32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) h = std::rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string hash_hex(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

ContentHash ContentHash::of(Kind kind, const void* data, std::size_t n) {
  return {kind, kind == Kind::kXxh64 ? xxh64(data, n) : fnv1a64(data, n)};
}

std::string ContentHash::str() const {
  return std::string(kind == Kind::kXxh64 ? "xxh64 " : "fnv1a64 ") + hash_hex(value);
}

InputHashes input_hashes(const Case& c) {
  InputHashes h;
  const auto ts = golden::schema::input_tensors(c);
  std::uint64_t* each[5] = {&h.q, &h.kv_c, &h.k_pe, &h.w_uk, &h.w_uv};
  h.combined = kFnvOffset;
  // Each tensor's hash and the running combined one in one pass: two
  // independent multiply chains, about the time of one.
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(ts[i]->bytes());
    std::uint64_t a = kFnvOffset, b = h.combined;
    for (std::size_t k = 0, n = ts[i]->nbytes(); k < n; ++k) {
      a = (a ^ p[k]) * kFnvPrime;
      b = (b ^ p[k]) * kFnvPrime;
    }
    *each[i] = a;
    h.combined = b;
  }
  h.xxh = input_xxh64(c);
  h.has_xxh = true;
  return h;
}

std::array<std::uint64_t, 5> input_xxh64(const Case& c) {
  const auto ts = golden::schema::input_tensors(c);
  std::array<std::uint64_t, 5> out{};
  for (std::size_t i = 0; i < ts.size(); ++i) out[i] = xxh64(ts[i]->bytes(), ts[i]->nbytes());
  return out;
}

}  // namespace mlagate
