// The test plugins' side of the C ABI: DLTensors as mlagate's TensorViews
// (device, dtype and row-major strides checked) and a plugin problem's cache
// tensor as a PagedCache, so in-tree host backends can serve behind the ABI.
#pragma once

#include <cstdint>
#include <span>

#include "cases/paged_cache.h"
#include "cases/tensor.h"
#include "mlagate/plugin.h"

namespace mlagate::test_plugin {

DType dtype_of(const DLDataType& t);  // throws std::invalid_argument for others
// A host DLTensor as a TensorView; throws std::invalid_argument naming `name`.
TensorView view(const DLTensor& t, DType want, const char* name);
bool absent(const DLTensor& t);  // data NULL, ndim 0: an optional tensor not given

template <class T>
std::span<const T> span_of(const TensorView& v) {
  return {static_cast<const T*>(v.data), static_cast<std::size_t>(v.numel())};
}

DType model_dtype(const mlagate_problem& p);
KvCacheDtype kv_dtype(std::uint32_t bit);
// A copy of the cache the problem describes (entry layout, block size, fp8_v4's
// split pages), with the block table when given. `block_size` 0: the
// problem's (a compressed cache passes its own).
PagedCache cache_from(const mlagate_problem& p, const DLTensor& data, const DLTensor* table, int block_size = 0);

}  // namespace mlagate::test_plugin
