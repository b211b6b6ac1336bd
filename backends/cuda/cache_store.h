// Paged caches on the device, uploaded once per case and block size and shared
// by every CUDA backend of the process. A cache is found by a 128-bit hash of
// its whole content (bytes, block table, layout), so a host cache that changed
// in any byte is uploaded again and a stale device copy is never used.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

#include "cases/paged_cache.h"
#include "gpu/device.h"

namespace mlagate::gpu {

struct CacheKey {
  std::uint64_t a = 0, b = 0;
  bool operator==(const CacheKey&) const = default;
};
// Hash of the cache's layout, block table and bytes (OpenMP over 1 MiB chunks,
// combined in order: the value does not depend on the thread count).
CacheKey cache_key(const PagedCache& c);

// A cache's pool into device memory of at least its size, at the same offsets:
// its live bytes only (cases/page_store.h). A huge pool's gap, never written
// on the host, keeps whatever the device memory held, as unused pages of a
// serving engine's pool do.
void upload_pool(DeviceBuffer& dst, const PagedCache& host, cudaStream_t s);

// A PagedCache's bytes [num_blocks, block_size, entry_bytes] and block table
// [rows, width] int32 on the device.
struct DeviceCache {
  CacheKey key;
  DeviceBuffer data;
  DeviceBuffer block_table;
  std::size_t bytes() const { return data.size() + block_table.size(); }
};

class DeviceCacheStore {
 public:
  static DeviceCacheStore& instance();

  // The device copy of `host`, uploaded on a miss.
  std::shared_ptr<const DeviceCache> get(const PagedCache& host, cudaStream_t s);
  // A fresh device copy of `host` (from a stored copy when there is one) that
  // the caller may modify; adopt() it afterwards under the new content's key.
  std::shared_ptr<DeviceCache> copy_for_write(const PagedCache& host, cudaStream_t s);
  void adopt(std::shared_ptr<DeviceCache> c);

  std::uint64_t uploads() const { return uploads_; }  // host -> device cache uploads so far
  std::uint64_t hits() const { return hits_; }
  void clear();

 private:
  std::shared_ptr<const DeviceCache> find(const CacheKey& k);
  void insert(std::shared_ptr<DeviceCache> c);

  // Most recently used first; a few entries (a case's caches for its block sizes
  // with and without the new tokens) under a byte budget.
  static constexpr std::size_t kMaxEntries = 6;
  static constexpr std::size_t kMaxBytes = std::size_t{8} << 30;
  std::list<std::shared_ptr<DeviceCache>> entries_;
  std::mutex mu_;
  std::uint64_t uploads_ = 0, hits_ = 0;
};

}  // namespace mlagate::gpu
