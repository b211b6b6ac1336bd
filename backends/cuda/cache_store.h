// Paged caches on the device, uploaded once per case and block size and shared
// by every CUDA backend of the process. A cache is found by a 128-bit hash of
// its whole content (bytes, block table, layout), so a host cache that changed
// in any byte is uploaded again and a stale device copy is never used.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>

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

// A cache's pool into device memory of at least its size, at the same offsets
// (+ `offset`): its live bytes only (cases/page_store.h). A huge pool's gap,
// never written on the host, keeps whatever the device memory held, as unused
// pages of a serving engine's pool do.
void upload_pool(DeviceBuffer& dst, const PagedCache& host, cudaStream_t s, std::size_t offset = 0);

// A PagedCache's bytes [num_blocks, block_size, entry_bytes] and block table
// [rows, width] int32 on the device. Under layout strided the pool is one
// layer of a stacked cache there too: `before` and `after` bytes of other
// layers (PageStore::kOtherLayerByte) around it, so the kernels get a pointer
// at a nonzero offset into a larger allocation, as vLLM's per-layer views.
struct DeviceCache {
  CacheKey key;
  DeviceBuffer data;  // [before | the pool | after]
  DeviceBuffer block_table;
  std::size_t before = 0, after = 0;
  std::size_t bytes() const { return data.size() + block_table.size(); }
  void* layer() const { return static_cast<unsigned char*>(data.data()) + before; }
  template <class T>
  T* layer_as() const {
    return static_cast<T*>(layer());
  }
  // Empty when the other layers hold their byte, else where the first write
  // into them went (synchronizes s).
  std::string other_layers_change(cudaStream_t s) const;
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
