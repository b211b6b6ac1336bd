// cpu.sparse behind the C ABI of mlagate/plugin.h (1.2): the sparse ops'
// arguments turned back into SparseDecodeArgs / SparsePrefillArgs, so every
// sparse case gives the in-tree backend's bits through the ABI. With a planted
// fault it is one of the broken sparse plugins the tests plant.
#include "tests/plugin/cpu_sparse_plugin.h"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/sparse_faults.h"
#include "cases/errors.h"
#include "tests/plugin/dl_view.h"

namespace {

using namespace mlagate;
using namespace mlagate::test_plugin;

struct Plugin {
  SparseFault fault = SparseFault::kNone;
  std::unique_ptr<Backend> backend;
  std::vector<std::int32_t> block_sizes;
  mlagate_backend table{};
  mlagate_plugin plugin{};
};

std::span<const std::int32_t> ints_or_empty(const DLTensor& t, const char* name) {
  if (absent(t)) return {};
  return span_of<std::int32_t>(view(t, DType::kI32, name));
}

// What a hostile plugin does after computing the right answer.
void misbehave(SparseFault fault, const mlagate_problem& p, DLTensor& o, const DLTensor& indices) {
  if (fault == SparseFault::kDenseShape) o.shape[2] = p.kv_lora_rank;  // the latent alone
  if (fault == SparseFault::kUndeclaredDtype) o.dtype = DLDataType{kDLFloat, 32, 1};
  if (fault == SparseFault::kWritesIndices && !absent(indices)) {
    auto* idx = static_cast<std::int32_t*>(indices.data);
    std::int64_t n = 1;
    for (int i = 0; i < indices.ndim; ++i) n *= indices.shape[i];
    for (std::int64_t i = 0; i < n; ++i)
      if (idx[i] == -1) idx[i] = 0;
  }
}

void sparse_decode(Plugin& plugin, const mlagate_problem& p, const mlagate_sparse_decode_args& a) {
  const DType dt = model_dtype(p);
  SparseDecodeArgs d;
  d.q = view(a.q, dt, "q");
  const PagedCache cache = cache_from(p, a.kv_cache, &a.block_table);
  d.cache = &cache;
  if (!absent(a.indices)) d.indices = view(a.indices, DType::kI32, "indices");
  d.topk_length = ints_or_empty(a.topk_length, "topk_length");
  d.window = p.window;
  d.seq_lens = span_of<std::int32_t>(view(a.seq_lens, DType::kI32, "seq_lens"));
  d.query_start_loc = span_of<std::int32_t>(view(a.query_start_loc, DType::kI32, "query_start_loc"));
  std::vector<std::int32_t> rows(d.seq_lens.size());
  std::iota(rows.begin(), rows.end(), 0);
  d.block_table_rows = rows;
  std::unique_ptr<PagedCache> extra;
  if (!absent(a.extra_kv_cache)) {
    extra = std::make_unique<PagedCache>(cache_from(p, a.extra_kv_cache, nullptr, p.extra_block_size));
    d.extra_cache = extra.get();
  }
  if (!absent(a.extra_indices)) d.extra_indices = view(a.extra_indices, DType::kI32, "extra_indices");
  d.extra_topk_length = ints_or_empty(a.extra_topk_length, "extra_topk_length");
  if (!absent(a.sink)) d.sink = span_of<float>(view(a.sink, DType::kF32, "sink"));
  d.scale = p.scale;
  d.o = view(a.o, dt, "o");
  d.lse = view(a.lse, DType::kF32, "lse");
  plugin.backend->sparse_decode(d);
  misbehave(plugin.fault, p, const_cast<DLTensor&>(a.o), a.indices);
}

void sparse_prefill(Plugin& plugin, const mlagate_problem& p, const mlagate_sparse_prefill_args& a) {
  const DType dt = model_dtype(p);
  SparsePrefillArgs f;
  f.q = view(a.q, dt, "q");
  f.kv = view(a.kv, dt, "kv");
  f.indices = view(a.indices, DType::kI32, "indices");
  f.topk_length = ints_or_empty(a.topk_length, "topk_length");
  if (!absent(a.sink)) f.sink = span_of<float>(view(a.sink, DType::kF32, "sink"));
  f.scale = p.scale;
  f.o = view(a.o, dt, "o");
  f.lse = view(a.lse, DType::kF32, "lse");
  plugin.backend->sparse_prefill(f);
  misbehave(plugin.fault, p, const_cast<DLTensor&>(a.o), a.indices);
}

std::int32_t run(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  Plugin& plugin = *static_cast<Plugin*>(self);
  return guarded(msg, msg_size, [&]() -> std::int32_t {
    if (p->struct_size < sizeof(mlagate_problem) || a->struct_size < sizeof(mlagate_args)) {
      say(msg, msg_size, "the host speaks an ABI older than 1.2");
      return MLAGATE_STATUS_NOT_SUPPORTED;
    }
    switch (p->op) {
      case MLAGATE_OP_SPARSE_DECODE: sparse_decode(plugin, *p, a->sparse_decode); break;
      case MLAGATE_OP_SPARSE_PREFILL: sparse_prefill(plugin, *p, a->sparse_prefill); break;
      default: say(msg, msg_size, "unknown op " + std::to_string(p->op)); return MLAGATE_STATUS_ERROR;
    }
    return MLAGATE_STATUS_OK;
  });
}

std::unique_ptr<Backend> make_backend(SparseFault fault) {
  SparseFaults f;
  f.ignores_topk_length = fault == SparseFault::kIgnoresTopkLength;
  f.reads_invalid_index = fault == SparseFault::kReadsInvalidIndex;
  return detail::make_cpu_sparse_with_faults(f, "cpu.sparse");
}

}  // namespace

const mlagate_plugin* cpu_sparse_plugin_table(const char* name, SparseFault fault) {
  static Plugin* p = [&] {
    auto* s = new Plugin;
    s->fault = fault;
    s->backend = make_backend(fault);
    const Capabilities caps = s->backend->capabilities();
    s->block_sizes.assign(caps.block_sizes.begin(), caps.block_sizes.end());
    mlagate_backend& t = s->table;
    t.name = name;
    t.description = "cpu.sparse built as an ABI 1.2 plugin (the sparse ops through the C ABI)";
    t.ops = MLAGATE_OP_SPARSE_DECODE | MLAGATE_OP_SPARSE_PREFILL;
    t.block_sizes = s->block_sizes.data();
    t.num_block_sizes = static_cast<std::int32_t>(s->block_sizes.size());
    t.query_len_support = MLAGATE_QUERY_LEN_VARLEN;
    t.reorder_threshold = 1;
    for (DType d : caps.dtypes) t.dtypes |= d == DType::kBF16 ? MLAGATE_DTYPE_BF16 : MLAGATE_DTYPE_F16;
    for (KvCacheDtype k : caps.kv_dtypes)
      t.kv_cache_dtypes |= k == KvCacheDtype::kAuto      ? MLAGATE_KV_AUTO
                           : k == KvCacheDtype::kFp8     ? MLAGATE_KV_FP8
                           : k == KvCacheDtype::kFp8E4m3 ? MLAGATE_KV_FP8_E4M3
                           : k == KvCacheDtype::kFp8V4   ? MLAGATE_KV_FP8_V4
                                                         : MLAGATE_KV_FP8_DS_MLA;
    t.device = {kDLCPU, 0};
    t.self = s;
    t.run = run;
    s->plugin.abi_version = MLAGATE_PLUGIN_ABI_VERSION;
    s->plugin.struct_size = sizeof(mlagate_plugin);
    s->plugin.library = "cpu_sparse_plugin";
    s->plugin.num_backends = 1;
    s->plugin.backends = &s->table;
    s->plugin.abi_minor = fault == SparseFault::kOldMinor ? 1 : MLAGATE_PLUGIN_ABI_MINOR;
    s->plugin.backend_struct_size = sizeof(mlagate_backend);
    return s;
  }();
  return &p->plugin;
}
