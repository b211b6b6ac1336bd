// The test plugins' side of the C ABI: DLTensors as mlagate's TensorViews
// (device, dtype and row-major strides checked) and a plugin problem's cache
// tensor as a PagedCache, so in-tree host backends can serve behind the ABI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <span>
#include <string>

#include "cases/errors.h"
#include "cases/paged_cache.h"
#include "cases/tensor.h"
#include "mlagate/plugin.h"

namespace mlagate::test_plugin {

DType dtype_of(const DLDataType& t);  // throws std::invalid_argument for others
// A host DLTensor as a TensorView; throws std::invalid_argument naming `name`.
// strided: its strides kept (a backend declaring ABI 1.3's strided_views);
// otherwise anything but row-major contiguous is refused.
TensorView view(const DLTensor& t, DType want, const char* name, bool strided = false);
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

// A message into a plugin's message buffer (truncated, NUL-terminated).
inline void say(char* buf, std::size_t size, const std::string& s) {
  if (size) std::snprintf(buf, size, "%s", s.c_str());
}

// The boundary of a test plugin's run(): `call` returns a status, and what it
// throws becomes one (NotSupportedError: NOT_SUPPORTED, anything else: ERROR)
// with its message, as plugin.h asks of every plugin.
template <class F>
std::int32_t guarded(char* msg, std::size_t msg_size, F&& call) {
  try {
    return call();
  } catch (const NotSupportedError& e) {
    say(msg, msg_size, e.what());
    return MLAGATE_STATUS_NOT_SUPPORTED;
  } catch (const std::exception& e) {
    say(msg, msg_size, e.what());
    return MLAGATE_STATUS_ERROR;
  } catch (...) {
    say(msg, msg_size, "unknown exception");
    return MLAGATE_STATUS_ERROR;
  }
}

}  // namespace mlagate::test_plugin
