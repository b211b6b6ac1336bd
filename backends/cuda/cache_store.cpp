// The process-wide store of device paged caches, keyed by content hash.
#include "backends/cuda/cache_store.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace mlagate::gpu {
namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull;

std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
std::uint64_t fmix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

// Two independent 64-bit hashes of a byte range (xxHash64-style lanes).
CacheKey hash_bytes(const unsigned char* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t a[4] = {seed + kP1, seed ^ kP2, seed + kP3, seed - kP1};
  std::uint64_t b[4] = {seed ^ kP3, seed + kP2, seed - kP3, seed ^ kP1};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      a[l] = rotl(a[l] + w * kP2, 31) * kP1;
      b[l] = rotl(b[l] ^ (w * kP3), 27) * kP2 + kP1;
    }
  }
  std::uint64_t tail = 0;
  for (std::size_t k = 0; i + k < n; ++k) tail |= std::uint64_t{p[i + k]} << (8 * (k % 8)), tail = rotl(tail, 7);
  std::uint64_t ha = rotl(a[0], 1) + rotl(a[1], 7) + rotl(a[2], 12) + rotl(a[3], 18) + n;
  std::uint64_t hb = rotl(b[0], 3) ^ rotl(b[1], 11) ^ rotl(b[2], 17) ^ rotl(b[3], 29) ^ (n * kP3);
  return {fmix(ha ^ tail * kP1), fmix(hb + tail * kP2)};
}

CacheKey combine(CacheKey k, CacheKey x) { return {fmix(k.a * kP1 ^ x.a), fmix(rotl(k.b, 17) + x.b * kP2)}; }

}  // namespace

CacheKey cache_key(const PagedCache& c) {
  const std::int64_t meta[] = {static_cast<std::int64_t>(c.kv_dtype), static_cast<std::int64_t>(c.elem_dtype),
                               c.block_size, c.num_blocks, c.entry_bytes, c.table_width,
                               c.block_table.empty() ? 0 : c.block_table.dim(0),
                               static_cast<std::int64_t>(c.data.nbytes()),
                               // the stacked cache's other layers: a device copy has them too
                               c.data.placement().before, c.data.placement().after};
  CacheKey k = hash_bytes(reinterpret_cast<const unsigned char*>(meta), sizeof meta, 1);
  k = combine(k, hash_bytes(reinterpret_cast<const unsigned char*>(c.block_table.bytes()), c.block_table.nbytes(), 2));
  // The live bytes (a huge pool's gap is never written, cases/page_store.h).
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::uint64_t salt = 3;
  c.data.for_each_live_range([&](std::int64_t b, std::int64_t e) {
    const auto n = static_cast<std::size_t>(e - b);
    const auto chunks = static_cast<std::int64_t>((n + kChunk - 1) / kChunk);
    std::vector<CacheKey> parts(static_cast<std::size_t>(chunks));
    const auto* p = reinterpret_cast<const unsigned char*>(c.data.bytes()) + b;
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < chunks; ++i) {
      const std::size_t off = static_cast<std::size_t>(i) * kChunk;
      parts[static_cast<std::size_t>(i)] = hash_bytes(p + off, std::min(kChunk, n - off), salt + static_cast<std::uint64_t>(i));
    }
    for (const CacheKey& x : parts) k = combine(k, x);
    salt += static_cast<std::uint64_t>(chunks) + static_cast<std::uint64_t>(b);
  });
  return k;
}

void upload_pool(DeviceBuffer& dst, const PagedCache& host, cudaStream_t s, std::size_t offset) {
  host.data.for_each_live_range([&](std::int64_t b, std::int64_t e) {
    dst.upload(host.data.bytes() + b, static_cast<std::size_t>(e - b), s, offset + static_cast<std::size_t>(b));
  });
}

std::string DeviceCache::other_layers_change(cudaStream_t s) const {
  const auto check = [&](std::size_t from, std::size_t n, const char* where) -> std::string {
    if (n == 0) return {};
    std::vector<unsigned char> h(n);
    data.download(h.data(), n, s, from);
    for (std::size_t i = 0; i < n; ++i)
      if (h[i] != static_cast<unsigned char>(PageStore::kOtherLayerByte))
        return std::string("a write into another layer of the stacked cache (device), ") + where + ", byte " +
               std::to_string(i) + " of " + std::to_string(n);
    return {};
  };
  std::string w = check(0, before, "the layers before this one");
  if (w.empty()) w = check(data.size() - after, after, "the layers after this one");
  return w;
}

DeviceCacheStore& DeviceCacheStore::instance() {
  static DeviceCacheStore store;
  return store;
}

std::shared_ptr<const DeviceCache> DeviceCacheStore::find(const CacheKey& k) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if ((*it)->key == k) {
      entries_.splice(entries_.begin(), entries_, it);  // most recently used first
      ++hits_;
      return entries_.front();
    }
  return nullptr;
}

void DeviceCacheStore::insert(std::shared_ptr<DeviceCache> c) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if ((*it)->key == c->key) {
      entries_.erase(it);
      break;
    }
  entries_.push_front(std::move(c));
  std::size_t bytes = 0, n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    bytes += (*it)->bytes();
    ++n;
    // Keep the newest entry whatever its size; drop older ones past the budget.
    if (n > 1 && (n > kMaxEntries || bytes > kMaxBytes)) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

std::shared_ptr<const DeviceCache> DeviceCacheStore::get(const PagedCache& host, cudaStream_t s) {
  const CacheKey k = cache_key(host);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto hit = find(k)) return hit;
  auto c = std::make_shared<DeviceCache>();
  c->key = k;
  c->before = static_cast<std::size_t>(host.data.placement().before);
  c->after = static_cast<std::size_t>(host.data.placement().after);
  c->data = DeviceBuffer(c->before + host.data.nbytes() + c->after);
  const auto other = static_cast<int>(PageStore::kOtherLayerByte);
  if (c->before) MLAGATE_CUDA_CHECK(cudaMemsetAsync(c->data.data(), other, c->before, s));
  if (c->after)
    MLAGATE_CUDA_CHECK(cudaMemsetAsync(static_cast<unsigned char*>(c->data.data()) + c->before + host.data.nbytes(), other,
                                       c->after, s));
  upload_pool(c->data, host, s, c->before);
  c->block_table = DeviceBuffer(host.block_table.nbytes());
  c->block_table.upload(host.block_table.bytes(), host.block_table.nbytes(), s);
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
  ++uploads_;
  insert(c);
  return c;
}

std::shared_ptr<DeviceCache> DeviceCacheStore::copy_for_write(const PagedCache& host, cudaStream_t s) {
  std::shared_ptr<const DeviceCache> base = get(host, s);
  auto c = std::make_shared<DeviceCache>();
  c->before = base->before;
  c->after = base->after;
  c->data = DeviceBuffer(base->data.size());
  c->block_table = DeviceBuffer(base->block_table.size());
  MLAGATE_CUDA_CHECK(cudaMemcpyAsync(c->data.data(), base->data.data(), base->data.size(), cudaMemcpyDeviceToDevice, s));
  MLAGATE_CUDA_CHECK(cudaMemcpyAsync(c->block_table.data(), base->block_table.data(), base->block_table.size(),
                                     cudaMemcpyDeviceToDevice, s));
  return c;
}

void DeviceCacheStore::adopt(std::shared_ptr<DeviceCache> c) {
  std::lock_guard<std::mutex> lock(mu_);
  insert(std::move(c));
}

void DeviceCacheStore::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

}  // namespace mlagate::gpu
