// cpu.paged behind the C ABI of mlagate/plugin.h. Built as a shared library it
// is the ABI's completeness proof: every suite must give bit-identical results
// through it and through the in-tree backend. With a planted fault it becomes
// one of the broken plugins the tests plant: each library links this object
// with plugin_entry.cpp, which names the backend, picks the fault and exports
// (or, for one fault, misspells) the entry symbol.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "cases/errors.h"
#include "mlagate/plugin.h"

#include "tests/plugin/cpu_paged_plugin.h"
#include "tests/plugin/dl_view.h"

namespace {

using namespace mlagate;

using namespace mlagate::test_plugin;

struct Plugin {
  PlantedFault fault = PlantedFault::kNone;
  std::unique_ptr<Backend> backend = make_cpu_paged();
  Capabilities caps = backend->capabilities();
  std::vector<std::int32_t> block_sizes;
  mlagate_backend table{};
  mlagate_plugin plugin{};
  std::vector<std::int32_t> schedule;  // prepare(): the seq_lens of the call it prepared
  std::vector<unsigned char> abi10;    // kAbi10: the backend tables in ABI 1.0 layout
};

void decode(Backend& b, PlantedFault fault, const mlagate_problem& p, const mlagate_decode_args& a) {
  const DType dt = model_dtype(p);
  DecodeArgs d;
  const bool strided = fault == PlantedFault::kLayouts;  // cpu.paged honours strides (ABI 1.3)
  d.q_lat = view(a.q_lat, dt, "q_lat", strided);
  d.q_pe = view(a.q_pe, dt, "q_pe", strided);
  const PagedCache cache = cache_from(p, a.kv_cache, &a.block_table);
  d.cache = &cache;
  const TensorView seq = view(a.seq_lens, DType::kI32, "seq_lens");
  const TensorView qsl = view(a.query_start_loc, DType::kI32, "query_start_loc");
  d.seq_lens = span_of<std::int32_t>(seq);
  d.query_start_loc = span_of<std::int32_t>(qsl);
  std::vector<std::int32_t> rows(d.seq_lens.size());
  std::iota(rows.begin(), rows.end(), 0);
  d.block_table_rows = rows;
  d.scale = p.scale;
  d.k_scale = p.k_scale;
  d.o_lat = view(a.o_lat, dt, "o_lat", strided);
  d.lse = view(a.lse, DType::kF32, "lse", strided);
  if (fault == PlantedFault::kThrows) throw std::runtime_error("planted: an exception thrown across the C boundary");
  b.decode(d);
  auto* o = static_cast<std::uint16_t*>(d.o_lat.data);
  if (fault == PlantedFault::kNan) o[d.o_lat.numel() / 2] = 0x7FC0;  // one NaN mid o_lat: the record must locate it
  if (fault == PlantedFault::kOutOfBounds) o[d.o_lat.numel()] = 0;   // one element past the end: the guard band must see it
  // A hostile plugin that casts away const and re-describes its output: the
  // buffer holds the right answer, the descriptor says it is something else.
  auto& out = const_cast<DLTensor&>(a.o_lat);
  if (fault == PlantedFault::kRedescribeShape) out.shape[2] -= 1;
  if (fault == PlantedFault::kRedescribeDtype) out.dtype = DLDataType{kDLFloat, 32, 1};
  if (fault == PlantedFault::kRedescribeDevice) out.device = DLDevice{kDLCUDA, 0};
}

void prefill(Backend& b, const mlagate_problem& p, const mlagate_prefill_args& a) {
  const DType dt = model_dtype(p);
  PrefillArgs f;
  f.q = view(a.q, dt, "q");
  f.k = view(a.k, dt, "k");
  f.v = view(a.v, dt, "v");
  const TensorView cq = view(a.cu_seqlens_q, DType::kI32, "cu_seqlens_q");
  const TensorView ck = view(a.cu_seqlens_k, DType::kI32, "cu_seqlens_k");
  f.cu_seqlens_q = span_of<std::int32_t>(cq);
  f.cu_seqlens_k = span_of<std::int32_t>(ck);
  f.causal = p.causal != 0;
  f.scale = p.scale;
  f.o = view(a.o, dt, "o");
  f.lse = view(a.lse, DType::kF32, "lse");
  b.prefill(f);
}

void cache_write(Backend& b, const mlagate_problem& p, const mlagate_cache_write_args& a) {
  const DType dt = model_dtype(p);
  PagedCache cache = cache_from(p, a.kv_cache, nullptr);
  const TensorView kv = view(a.kv_c, dt, "kv_c"), pe = view(a.k_pe, dt, "k_pe");
  const TensorView slots = view(a.slot_mapping, DType::kI64, "slot_mapping");
  b.cache_write(cache, kv, pe, span_of<std::int64_t>(slots));
  std::memcpy(static_cast<char*>(a.kv_cache.data) + a.kv_cache.byte_offset, cache.data.bytes(), cache.data.nbytes());
}

// The part of a call a serving engine runs outside its graph: here the
// schedule is the call's seq_lens, which decode checks against its tensor.
std::int32_t prepare(void* self, const mlagate_problem* p, const mlagate_args*, char* msg, std::size_t msg_size) {
  Plugin& plugin = *static_cast<Plugin*>(self);
  if (plugin.fault == PlantedFault::kPrepareFails) {
    say(msg, msg_size, "planted: prepare() fails");
    return MLAGATE_STATUS_ERROR;
  }
  plugin.schedule.assign(p->seq_lens, p->seq_lens + p->num_requests);
  return MLAGATE_STATUS_OK;
}

std::int32_t run(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  Plugin& plugin = *static_cast<Plugin*>(self);
  Backend& b = *plugin.backend;
  if (p->op == MLAGATE_OP_DECODE && plugin.fault != PlantedFault::kAbi10) {
    const auto* seq = static_cast<const std::int32_t*>(a->decode.seq_lens.data);
    if (plugin.schedule.size() != static_cast<std::size_t>(p->num_requests) ||
        !std::equal(plugin.schedule.begin(), plugin.schedule.end(), seq)) {
      say(msg, msg_size, "run() without a prepare() of its own seq_lens");
      return MLAGATE_STATUS_ERROR;
    }
  }
  // No try here: the planted plugin lets its exception escape.
  if (plugin.fault == PlantedFault::kThrows && p->op == MLAGATE_OP_DECODE) decode(b, plugin.fault, *p, a->decode);
  return guarded(msg, msg_size, [&]() -> std::int32_t {
    switch (p->op) {
      case MLAGATE_OP_DECODE: decode(b, plugin.fault, *p, a->decode); break;
      case MLAGATE_OP_PREFILL: prefill(b, *p, a->prefill); break;
      case MLAGATE_OP_CACHE_WRITE: cache_write(b, *p, a->cache_write); break;
      default: say(msg, msg_size, "unknown op " + std::to_string(p->op)); return MLAGATE_STATUS_ERROR;
    }
    return MLAGATE_STATUS_OK;
  });
}

std::uint32_t bits_of_ops(const Capabilities& c) {
  std::uint32_t m = 0;
  for (Op op : c.ops) {
    if (op == Op::kDecode) m |= MLAGATE_OP_DECODE;
    if (op == Op::kPrefill) m |= MLAGATE_OP_PREFILL;
    if (op == Op::kCacheWrite) m |= MLAGATE_OP_CACHE_WRITE;
  }
  return m;
}

}  // namespace

using namespace mlagate;

// The table, built once from cpu.paged's own capabilities.
const mlagate_plugin* cpu_paged_plugin_table(const char* name, PlantedFault fault) {
  static Plugin* p = [&] {
    auto* s = new Plugin;
    s->fault = fault;
    s->block_sizes.assign(s->caps.block_sizes.begin(), s->caps.block_sizes.end());
    mlagate_backend& t = s->table;
    t.name = name;
    t.description = "cpu.paged built as a plugin (the ABI's completeness proof)";
    t.ops = bits_of_ops(s->caps);
    t.block_sizes = s->block_sizes.data();
    t.num_block_sizes = static_cast<std::int32_t>(s->block_sizes.size());
    t.query_len_support = s->caps.query_len_support == QueryLenSupport::kSingleOnly ? MLAGATE_QUERY_LEN_SINGLE_ONLY
                          : s->caps.query_len_support == QueryLenSupport::kUniform  ? MLAGATE_QUERY_LEN_UNIFORM
                                                                                    : MLAGATE_QUERY_LEN_VARLEN;
    t.reorder_threshold = s->caps.reorder_threshold;
    for (DType d : s->caps.dtypes) t.dtypes |= d == DType::kBF16 ? MLAGATE_DTYPE_BF16 : MLAGATE_DTYPE_F16;
    for (KvCacheDtype k : s->caps.kv_dtypes)
      t.kv_cache_dtypes |= k == KvCacheDtype::kAuto      ? MLAGATE_KV_AUTO
                           : k == KvCacheDtype::kFp8     ? MLAGATE_KV_FP8
                           : k == KvCacheDtype::kFp8E4m3 ? MLAGATE_KV_FP8_E4M3
                                                         : MLAGATE_KV_FP8_DS_MLA;
    t.device = {kDLCPU, 0};
    t.self = s;
    t.supports = nullptr;  // cpu.paged decides from its capabilities alone
    t.run = fault == PlantedFault::kNullRun ? nullptr : run;
    t.destroy = nullptr;  // the table lives as long as the (never unmapped) library
    t.graph_ops = MLAGATE_OP_DECODE;
    t.prepare = prepare;
    if (fault == PlantedFault::kLayouts) {
      t.strided_views = 1;
      t.max_pool_bytes = std::int64_t{1} << 40;
    }
    s->plugin.abi_version = fault == PlantedFault::kBadAbi ? 99 : MLAGATE_PLUGIN_ABI_VERSION;
    s->plugin.struct_size = sizeof(mlagate_plugin);
    s->plugin.library = "cpu_paged_plugin";
    s->plugin.num_backends = 1;
    s->plugin.backends = &s->table;
    s->plugin.abi_minor = fault == PlantedFault::kAbi11 ? 1 : MLAGATE_PLUGIN_ABI_MINOR + (fault == PlantedFault::kNewerMinor ? 1 : 0);
    if (fault == PlantedFault::kGarbageMinor) s->plugin.abi_minor = 1802464627u;
    s->plugin.backend_struct_size = sizeof(mlagate_backend);
    if (fault == PlantedFault::kAbi10) {
      // What a plugin built against the 1.0 header hands over: the 1.0 struct
      // sizes, and backends[] at the 1.0 stride (a second backend shows it).
      const std::size_t v10 = offsetof(mlagate_backend, graph_ops);
      s->abi10.assign(2 * v10, 0);
      mlagate_backend second = t;
      second.name = "planted.abi10.second";
      std::memcpy(s->abi10.data(), &t, v10);
      std::memcpy(s->abi10.data() + v10, &second, v10);
      s->plugin.backends = reinterpret_cast<const mlagate_backend*>(s->abi10.data());
      s->plugin.num_backends = 2;
      s->plugin.struct_size = offsetof(mlagate_plugin, abi_minor);
    }
    return s;
  }();
  return &p->plugin;
}
