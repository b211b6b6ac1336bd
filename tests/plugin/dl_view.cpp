// DLTensor views and PagedCache copies for the test plugins (dl_view.h).
#include "tests/plugin/dl_view.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "cases/fp8.h"

namespace mlagate::test_plugin {

DType dtype_of(const DLDataType& t) {
  if (t.lanes == 1) {
    if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
    if (t.code == kDLFloat && t.bits == 16) return DType::kF16;
    if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
    if (t.code == kDLInt && t.bits == 32) return DType::kI32;
    if (t.code == kDLInt && t.bits == 64) return DType::kI64;
    if (t.code == kDLUInt && t.bits == 8) return DType::kU8;
  }
  throw std::invalid_argument("unexpected DLPack dtype code " + std::to_string(t.code) + " bits " +
                              std::to_string(t.bits));
}

TensorView view(const DLTensor& t, DType want, const char* name, bool strided) {
  if (t.device.device_type != kDLCPU) throw std::invalid_argument(std::string(name) + ": not a host tensor");
  const DType dt = dtype_of(t.dtype);
  if (dt != want)
    throw std::invalid_argument(std::string(name) + ": dtype " + std::string(dtype_name(dt)) + ", expected " +
                                std::string(dtype_name(want)));
  Shape shape(t.shape, t.shape + t.ndim);
  if (strided && t.strides) {
    TensorView v{dt, std::move(shape), static_cast<char*>(t.data) + t.byte_offset};
    v.strides.assign(t.strides, t.strides + t.ndim);
    return v;
  }
  if (t.strides) {
    std::int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (shape[i] > 1 && t.strides[i] != expect) throw std::invalid_argument(std::string(name) + ": not row-major contiguous");
      expect *= shape[i];
    }
  }
  return {dt, std::move(shape), static_cast<char*>(t.data) + t.byte_offset};
}

bool absent(const DLTensor& t) { return t.data == nullptr && t.ndim == 0; }

DType model_dtype(const mlagate_problem& p) { return p.dtype == MLAGATE_DTYPE_F16 ? DType::kF16 : DType::kBF16; }

KvCacheDtype kv_dtype(std::uint32_t bit) {
  switch (bit) {
    case MLAGATE_KV_AUTO: return KvCacheDtype::kAuto;
    case MLAGATE_KV_FP8: return KvCacheDtype::kFp8;
    case MLAGATE_KV_FP8_E4M3: return KvCacheDtype::kFp8E4m3;
    case MLAGATE_KV_FP8_DS_MLA: return KvCacheDtype::kFp8DsMla;
    case MLAGATE_KV_FP8_V4: return KvCacheDtype::kFp8V4;
  }
  throw std::invalid_argument("unknown kv cache dtype " + std::to_string(bit));
}

PagedCache cache_from(const mlagate_problem& p, const DLTensor& data, const DLTensor* table, int block_size) {
  const TensorView d = view(data, DType::kU8, "kv_cache");
  PagedCache c;
  c.kv_dtype = kv_dtype(p.kv_cache_dtype);
  c.elem_dtype = model_dtype(p);
  c.scale_rule = p.scale_rule == MLAGATE_SCALE_RULE_RAW ? ScaleRule::kRaw : ScaleRule::kPow2;
  c.k_scale = p.k_scale;
  c.kv_lora_rank = p.kv_lora_rank;
  c.rope_dim = p.rope_dim;
  c.num_blocks = static_cast<int>(d.shape.at(0));
  if (d.shape.size() == 3) {  // [num_blocks, block_size, entry_bytes]
    c.block_size = static_cast<int>(d.shape[1]);
    c.entry_bytes = static_cast<int>(d.shape[2]);
  } else if (d.shape.size() == 2) {  // fp8_v4: [num_blocks, block_bytes] of split pages
    c.block_size = block_size ? block_size : p.block_size;
    c.entry_bytes = p.entry.bytes;
  } else {
    throw std::invalid_argument("kv_cache must be [num_blocks, block_size, entry_bytes] or [num_blocks, block_bytes]");
  }
  c.block_bytes = block_bytes(c.format(), c.block_size);
  if (static_cast<std::size_t>(c.block_bytes * c.num_blocks) != d.nbytes())
    throw std::invalid_argument("kv_cache: " + std::to_string(d.nbytes()) + " bytes, the layout needs " +
                                std::to_string(c.block_bytes * c.num_blocks));
  c.data = Tensor(DType::kU8, d.shape);
  std::memcpy(c.data.bytes(), d.data, d.nbytes());
  if (table) {
    const TensorView t = view(*table, DType::kI32, "block_table");
    if (t.shape.size() != 2) throw std::invalid_argument("block_table must be [B, W]");
    c.table_width = static_cast<int>(t.shape[1]);
    c.block_table = Tensor(DType::kI32, t.shape);
    std::memcpy(c.block_table.bytes(), t.data, t.nbytes());
  }
  return c;
}

}  // namespace mlagate::test_plugin
