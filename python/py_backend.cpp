// PyBackend and the argument dicts (py_backend.h).
#include "python/py_backend.h"

#include <pybind11/stl.h>

#include <cstring>

#include "cases/case_spec.h"
#include "cases/errors.h"
#include "cases/paged_cache.h"
#include "harness/run/ops/op_run.h"
#include "harness/run/run_config.h"
#include "python/dlpack.h"

namespace mlagate::py {
namespace {

pyb::object wrap(const TensorView& v, Hold h, bool output = false) {
  if (v.data == nullptr && v.numel() != 0) return pyb::none();
  PyTensor t = h == Hold::kCopy ? PyTensor::copy_of(v) : PyTensor::borrowed(v, output);
  t.output = output;
  return pyb::cast(std::move(t));
}

// Small index arrays are always copied: a span may outlive nothing.
template <class T>
pyb::object ints(std::span<const T> s, DType dt) {
  Tensor t(dt, {static_cast<std::int64_t>(s.size())});
  if (!s.empty()) std::memcpy(t.bytes(), s.data(), s.size_bytes());
  return pyb::cast(PyTensor::owning(std::move(t)));
}

pyb::object floats_or_none(std::span<const float> s) {
  if (s.empty()) return pyb::none();
  return ints(s, DType::kF32);
}

pyb::object i32_or_none(std::span<const std::int32_t> s) {
  if (s.empty()) return pyb::none();
  return ints(s, DType::kI32);
}

// The cache's pages as the kernels index them: auto [blocks, block_size, L+R]
// in the model dtype; fp8 formats as bytes [blocks, block_size, entry_bytes]
// (fp8_v4: [blocks, block_bytes], its pages are not whole entries).
TensorView cache_view(const PagedCache& c) {
  TensorView v;
  v.data = const_cast<std::byte*>(c.data.bytes());
  if (c.kv_dtype == KvCacheDtype::kAuto) {
    v.dtype = c.elem_dtype;
    v.shape = {c.num_blocks, c.block_size, c.kv_lora_rank + c.rope_dim};
  } else if (c.split_pages()) {
    v.dtype = DType::kU8;
    v.shape = {c.num_blocks, c.block_bytes};
  } else {
    v.dtype = DType::kU8;
    v.shape = {c.num_blocks, c.block_size, c.entry_bytes};
  }
  return v;
}

// The block table's rows of the requests, in request order.
pyb::object block_table(const PagedCache& c, std::span<const std::int32_t> rows) {
  const std::int64_t W = c.table_width;
  Tensor t(DType::kI32, {static_cast<std::int64_t>(rows.size()), W});
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::memcpy(t.data<std::int32_t>() + i * W, c.block_table.data<std::int32_t>() + rows[i] * W, W * sizeof(std::int32_t));
  return pyb::cast(PyTensor::owning(std::move(t)));
}

void add_cache(pyb::dict& d, const std::string& prefix, const PagedCache& c, Hold h) {
  d[(prefix + "kv_cache").c_str()] = wrap(cache_view(c), h);
  d[(prefix + "kv_cache_dtype").c_str()] = kv_cache_format_name({c.kv_dtype, c.scale_rule});
  d[(prefix + "block_size").c_str()] = c.block_size;
}

}  // namespace

pyb::dict decode_args(const DecodeArgs& a, Hold h) {
  pyb::dict d;
  d["q_lat"] = wrap(a.q_lat, h);
  d["q_pe"] = wrap(a.q_pe, h);
  add_cache(d, "", *a.cache, h);
  d["block_table"] = block_table(*a.cache, a.block_table_rows);
  d["seq_lens"] = ints(a.seq_lens, DType::kI32);
  d["query_start_loc"] = ints(a.query_start_loc, DType::kI32);
  d["scale"] = a.scale;
  d["k_scale"] = a.k_scale;
  d["o_lat"] = wrap(a.o_lat, h, true);
  d["lse"] = wrap(a.lse, h, true);
  return d;
}

pyb::dict prefill_args(const PrefillArgs& a, Hold h) {
  pyb::dict d;
  d["q"] = wrap(a.q, h);
  d["k"] = wrap(a.k, h);
  d["v"] = wrap(a.v, h);
  d["cu_seqlens_q"] = ints(a.cu_seqlens_q, DType::kI32);
  d["cu_seqlens_k"] = ints(a.cu_seqlens_k, DType::kI32);
  d["causal"] = a.causal;
  d["scale"] = a.scale;
  d["o"] = wrap(a.o, h, true);
  d["lse"] = wrap(a.lse, h, true);
  return d;
}

// The keys both sparse ops end with, in the order a Python backend sees them.
template <class SparseArgs>
void add_sink_and_outputs(pyb::dict& d, const SparseArgs& a, Hold h) {
  d["sink"] = floats_or_none(a.sink);
  d["scale"] = a.scale;
  d["o"] = wrap(a.o, h, true);
  d["lse"] = wrap(a.lse, h, true);
}

pyb::dict sparse_decode_args(const SparseDecodeArgs& a, Hold h) {
  pyb::dict d;
  d["q"] = wrap(a.q, h);
  add_cache(d, "", *a.cache, h);
  d["indices"] = a.indices.numel() ? wrap(a.indices, h) : pyb::none();
  d["topk_length"] = i32_or_none(a.topk_length);
  d["window"] = a.window;
  d["seq_lens"] = ints(a.seq_lens, DType::kI32);
  d["query_start_loc"] = ints(a.query_start_loc, DType::kI32);
  d["block_table"] = block_table(*a.cache, a.block_table_rows);
  if (a.extra_cache) {
    add_cache(d, "extra_", *a.extra_cache, h);
    d["extra_block_table"] = block_table(*a.extra_cache, a.block_table_rows);
  } else {
    for (const char* k : {"extra_kv_cache", "extra_kv_cache_dtype", "extra_block_size", "extra_block_table"})
      d[k] = pyb::none();
  }
  d["extra_indices"] = a.extra_indices.numel() ? wrap(a.extra_indices, h) : pyb::none();
  d["extra_topk_length"] = i32_or_none(a.extra_topk_length);
  add_sink_and_outputs(d, a, h);
  return d;
}

pyb::dict sparse_prefill_args(const SparsePrefillArgs& a, Hold h) {
  pyb::dict d;
  d["q"] = wrap(a.q, h);
  d["kv"] = wrap(a.kv, h);
  d["indices"] = wrap(a.indices, h);
  d["topk_length"] = i32_or_none(a.topk_length);
  add_sink_and_outputs(d, a, h);
  return d;
}

pyb::dict merge_states_args(const MergeStatesArgs& a, Hold h) {
  pyb::dict d;
  d["prefix_output"] = wrap(a.prefix_output, h);
  d["prefix_lse"] = wrap(a.prefix_lse, h);
  d["suffix_output"] = wrap(a.suffix_output, h);
  d["suffix_lse"] = wrap(a.suffix_lse, h);
  d["output"] = wrap(a.output, h, true);
  d["output_lse"] = wrap(a.output_lse, h, true);
  return d;
}

pyb::dict spec_dict(const CaseSpec& s) {
  pyb::dict d;
  d["id"] = s.id();
  d["suite"] = s.suite;
  d["batch"] = s.batch.name;
  d["seq_lens"] = s.batch.seq_lens;
  d["query_lens"] = s.batch.query_lens;
  d["spec_decode"] = s.batch.spec_decode;
  d["num_heads"] = s.num_heads();
  d["total_heads"] = s.total_heads;
  d["tp"] = s.tp;
  d["dtype"] = std::string(dtype_short(s.dtype));
  d["kv_cache_dtype"] = kv_cache_format_name(s.kv_format());
  d["block_size"] = s.block_size;  // 0: the backend's preferred one
  d["seed"] = s.seed;
  d["kv_lora_rank"] = s.dims.kv_lora_rank;
  d["rope_dim"] = s.dims.rope_dim;
  d["nope_dim"] = s.dims.nope_dim;
  d["v_head_dim"] = s.dims.v_head_dim;
  d["scale"] = s.softmax_scale();
  d["k_scale"] = s.k_scale;
  d["sparse"] = s.sparse.active();
  d["topk"] = s.sparse.topk;
  d["window"] = s.sparse.window;
  d["compress"] = s.sparse.compress;
  d["extra_topk"] = s.sparse.extra_topk;
  d["sink"] = s.sparse.sink;
  d["merge"] = s.merge.active();
  d["head_dim"] = s.merge.head_dim;  // merge cases: D of the outputs
  d["lse_pattern"] = std::string(lse_pattern_name(s.merge.lse));
  d["lse_gap"] = s.merge.gap;
  return d;
}

PyBackendDecl::~PyBackendDecl() {
  if (!Py_IsInitialized()) {  // interpreter gone: leak the references rather than touch it
    dispatch.release();
    supports.release();
    capture.release();
    return;
  }
  pyb::gil_scoped_acquire gil;
  dispatch = pyb::object();
  supports = pyb::object();
  capture = pyb::object();
}

namespace {

class PyBackend final : public Backend {
 public:
  explicit PyBackend(std::shared_ptr<PyBackendDecl> d) : d_(std::move(d)) {}
  std::string_view name() const override { return d_->name; }
  std::string_view description() const override { return d_->description; }
  Capabilities capabilities() const override { return d_->caps; }

  Support supports(const CaseSpec& spec, Op op) const override {
    Support s = Backend::supports(spec, op);
    if (!s.ok || !d_->supports || d_->supports.is_none()) return s;
    pyb::gil_scoped_acquire gil;
    pyb::object why;
    try {
      why = d_->supports(spec_dict(spec), std::string(op_name(op)));
    } catch (pyb::error_already_set& e) {
      throw std::runtime_error(std::string("supports() raised ") + e.what());
    }
    if (why.is_none()) return Support::yes();
    return Support::no(pyb::str(why));
  }

  void decode(const DecodeArgs& a) override {
    call(Op::kDecode, [&] { return decode_args(a, Hold::kBorrow); },
         {{"q_lat", a.q_lat}, {"q_pe", a.q_pe}, {"kv_cache", cache_view(*a.cache), a.cache}});
  }
  // --cuda-graph: the Python layer's graph (mlagate/__init__.py, _TorchDecodeGraph or
  // _HostDecodeGraph) over the core's persistent arguments (persistent_decode_graph).
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override {
    if (!d_->capture || d_->capture.is_none())
      throw NotSupportedError(d_->name + " is not declared capturable (mlagate.Backend(..., cuda_graph=True))");
    // The Python graph dies with the handle, perhaps on a thread without the GIL.
    std::shared_ptr<pyb::object> graph(new pyb::object(), [](pyb::object* o) {
      if (Py_IsInitialized()) {
        pyb::gil_scoped_acquire gil;
        delete o;
      } else {
        o->release();
        delete o;
      }
    });
    return persistent_decode_graph(
        a,
        [this, graph](const DecodeArgs& p, bool capture) {
          answer([&] { return graph_step(*graph, p, capture); },
                 {{"q_lat", p.q_lat}, {"q_pe", p.q_pe}, {"kv_cache", cache_view(*p.cache), p.cache}});
        },
        "Python graph (torch.cuda.CUDAGraph on cuda, persistent buffers on cpu)");
  }

  void prefill(const PrefillArgs& a) override {
    call(Op::kPrefill, [&] { return prefill_args(a, Hold::kBorrow); }, {{"q", a.q}, {"k", a.k}, {"v", a.v}});
  }
  void sparse_decode(const SparseDecodeArgs& a) override {
    std::vector<Input> in{{"q", a.q}, {"kv_cache", cache_view(*a.cache), a.cache}, {"indices", a.indices},
                          {"extra_indices", a.extra_indices}};
    if (a.extra_cache) in.push_back({"extra_kv_cache", cache_view(*a.extra_cache)});
    call(Op::kSparseDecode, [&] { return sparse_decode_args(a, Hold::kBorrow); }, in);
  }
  void sparse_prefill(const SparsePrefillArgs& a) override {
    call(Op::kSparsePrefill, [&] { return sparse_prefill_args(a, Hold::kBorrow); },
         {{"q", a.q}, {"kv", a.kv}, {"indices", a.indices}});
  }
  void merge_states(const MergeStatesArgs& a) override {
    call(Op::kMergeStates, [&] { return merge_states_args(a, Hold::kBorrow); },
         {{"prefix_output", a.prefix_output}, {"prefix_lse", a.prefix_lse}, {"suffix_output", a.suffix_output},
          {"suffix_lse", a.suffix_lse}});
  }

 private:
  struct Input {
    const char* name;
    TensorView view;
    const PagedCache* cache = nullptr;  // set for a paged cache's view
  };
  // The inputs are the case's own, lent: a function that writes into them
  // would hand the next backend (and --repeat's next run) other inputs. Its
  // record says so instead.
  // A strided view's whole span (its padding between rows included); a placed
  // pool (layouts pool2g/pool4g) by its live ranges, not its gigabytes of gap.
  static std::uint64_t print(const Input& in) {
    if (in.cache && in.cache->data.placement().placed()) {
      std::uint64_t h = 0;
      in.cache->data.for_each_live_range([&](std::int64_t b, std::int64_t e) {
        h = h * 1099511628211ull ^ fingerprint(in.cache->data.bytes() + b, static_cast<std::size_t>(e - b));
      });
      return h;
    }
    return fingerprint(in.view.data, in.view.data ? in.view.span_bytes() : 0);
  }

  template <class MakeArgs>
  void call(Op op, MakeArgs make, const std::vector<Input>& inputs) {
    answer([&] { return d_->dispatch(std::string(op_name(op)), make()); }, inputs);
  }

  // `ask` (called under the GIL) returns the Python layer's answer: None, or (kind, message).
  template <class Ask>
  void answer(Ask ask, const std::vector<Input>& inputs) {
    std::vector<std::uint64_t> before;
    for (const Input& in : inputs) before.push_back(print(in));
    invoke(ask);
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (print(inputs[i]) != before[i])
        throw WrongOutputError(std::string("wrote into its input '") + inputs[i].name +
                               "' (inputs are read-only: later records in this process read them)");
  }

  // One step of a captured decode, under the GIL (invoke holds it): the capture
  // makes the Python graph object (or answers as dispatch does), a replay calls it.
  pyb::object graph_step(pyb::object& graph, const DecodeArgs& p, bool capture) {
    pyb::dict raw = decode_args(p, Hold::kBorrow);
    if (capture) {
      pyb::object r = d_->capture(raw);
      if (pyb::isinstance<pyb::tuple>(r)) return r;
      graph = r;
      return pyb::none();
    }
    if (!graph || graph.is_none()) return pyb::make_tuple("error", "replay of a graph whose capture failed");
    return graph.attr("replay")(raw);
  }

  template <class Ask>
  void invoke(Ask ask) {
    std::string kind, message;
    {
      pyb::gil_scoped_acquire gil;
      try {
        pyb::object r = ask();
        if (r.is_none()) return;
        auto t = r.cast<pyb::tuple>();
        kind = t[0].cast<std::string>();
        message = t[1].cast<std::string>();
      } catch (pyb::error_already_set& e) {
        // The dispatcher answers every error of the user's function; this is
        // the dispatcher itself, or an interrupt.
        kind = "error";
        message = std::string("the Python layer raised ") + e.what();
      }
    }
    if (kind == "not_supported") throw NotSupportedError(message);
    if (kind == "wrong_output") throw WrongOutputError(message);
    throw std::runtime_error(message);
  }

  std::shared_ptr<PyBackendDecl> d_;
};

}  // namespace

BackendEntry py_backend_entry(std::shared_ptr<PyBackendDecl> decl) {
  const std::string name = decl->name;
  return BackendEntry(name, BackendEntry::Make([decl](const BackendOptions&) -> std::unique_ptr<Backend> {
                        return std::make_unique<PyBackend>(decl);
                      }));
}

Capabilities parse_capabilities(const std::vector<std::string>& ops, const std::vector<int>& block_sizes,
                                const std::vector<std::string>& dtypes, const std::vector<std::string>& kv_dtypes,
                                const std::string& query_len_support, int reorder_threshold) {
  Capabilities c;
  for (const std::string& o : ops) {
    const Op op = parse_op(o);
    if (op == Op::kLayer || op == Op::kCacheWrite)
      throw InputError("op '" + o + "': a Python backend implements decode, prefill, sparse_decode, sparse_prefill, merge_states "
                       "(the layer op is composed from its decode and prefill)");
    c.ops.push_back(op);
  }
  if (c.ops.empty()) throw InputError("a Python backend needs at least one op");
  for (int b : block_sizes) {
    if (b < 1 || b > 1024 || (b & (b - 1)) != 0)
      throw InputError("block size " + std::to_string(b) + " is not a power of two in [1, 1024]");
    c.block_sizes.push_back(b);
  }
  if (c.block_sizes.empty()) throw InputError("a Python backend needs at least one block size");
  // fp32 is an output dtype of merge_states only (a merge case's dtype).
  for (const std::string& t : dtypes)
    c.dtypes.push_back(t == "fp32" || t == "f32" || t == "float32" ? DType::kF32 : parse_model_dtype(t));
  for (const std::string& t : kv_dtypes) c.kv_dtypes.push_back(parse_kv_cache_dtype(t));
  if (query_len_support == "single") c.query_len_support = QueryLenSupport::kSingleOnly;
  else if (query_len_support == "uniform") c.query_len_support = QueryLenSupport::kUniform;
  else if (query_len_support == "varlen") c.query_len_support = QueryLenSupport::kVarlen;
  else throw InputError("query_len_support '" + query_len_support + "' (expected single, uniform or varlen)");
  if (reorder_threshold < 1) throw InputError("reorder_threshold must be >= 1");
  c.reorder_threshold = reorder_threshold;
  return c;
}

}  // namespace mlagate::py
