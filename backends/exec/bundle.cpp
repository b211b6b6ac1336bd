// Bundle writing and outputs reading over golden/'s public HDF5 API
// (golden/tensor_file.h): bundles store tensors exactly as golden files do
// (16-bit floats as uint16 bits with a dtype attribute).
#include "backends/exec/bundle.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "golden/tensor_file.h"
#include "mlagate/version.h"

namespace mlagate::exec {

using golden::ReadAs;
using golden::StoredDataset;
using golden::StoredType;
using golden::TensorFile;
using golden::TensorGroup;

namespace {

std::string query_len_name(std::uint32_t q) {
  return q == MLAGATE_QUERY_LEN_SINGLE_ONLY ? "SINGLE_ONLY" : q == MLAGATE_QUERY_LEN_UNIFORM ? "UNIFORM" : "VARLEN";
}

void write_problem(TensorGroup& g, const plugin::Problem& p) {
  const mlagate_problem c = p.to_c(DLDevice{kDLCPU, 0});
  g.write_attr("op", std::string(op_name(p.op)));
  g.write_attr("case_id", p.case_id);
  g.write_attr("kv_lora_rank", c.kv_lora_rank);
  g.write_attr("rope_dim", c.rope_dim);
  g.write_attr("nope_dim", c.nope_dim);
  g.write_attr("v_head_dim", c.v_head_dim);
  g.write_attr("num_heads", c.num_heads);
  g.write_attr("num_requests", c.num_requests);
  g.write_attr("num_tokens", c.num_tokens);
  g.write_attr("num_kv_tokens", static_cast<std::int64_t>(c.num_kv_tokens));
  g.write_attr("max_seq_len", c.max_seq_len);
  g.write_attr("max_query_len", c.max_query_len);
  g.write_attr("query_len_support", query_len_name(c.query_len_support));
  g.write_attr("reorder_threshold", c.reorder_threshold);
  g.write_attr("spec_decode", c.spec_decode);
  g.write_attr("dtype", std::string(dtype_name(p.dtype)));
  g.write_attr("kv_cache_dtype", std::string(kv_cache_dtype_name(p.kv.dtype)));
  g.write_attr("scale_rule", std::string(scale_rule_name(p.kv.scale_rule)));
  g.write_attr("block_size", c.block_size);
  g.write_attr("entry_bytes", c.entry.bytes);
  g.write_attr("kv_c_offset", c.entry.kv_c_offset);
  g.write_attr("kv_c_elem_bytes", c.entry.kv_c_elem_bytes);
  g.write_attr("k_pe_offset", c.entry.k_pe_offset);
  g.write_attr("k_pe_elem_bytes", c.entry.k_pe_elem_bytes);
  g.write_attr("scale_offset", c.entry.scale_offset);
  g.write_attr("scale_count", c.entry.scale_count);
  g.write_attr("scale", c.scale);
  g.write_attr("k_scale", static_cast<double>(c.k_scale));
  g.write_attr("causal", c.causal);
  const std::int64_t b = static_cast<std::int64_t>(p.seq_lens.size());
  g.write_tensor("seq_lens", DType::kI32, {b}, p.seq_lens.data());
  g.write_tensor("query_lens", DType::kI32, {b}, p.query_lens.data());
}

std::string dims_str(const std::vector<std::uint64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

std::string type_str(const StoredType& t) {
  using C = StoredType::Class;
  const char* c = t.cls == C::kFloat     ? "float"
                  : t.cls == C::kInteger ? (t.is_unsigned ? "uint" : "int")
                  : t.cls == C::kString  ? "string"
                                         : "non-numeric";
  return std::string(c) + std::to_string(t.size * 8);
}

// One output dataset into its destination view, converting what a program may
// reasonably write: the dtype's own bits (16-bit floats as uint16 with a
// dtype attribute), or any float type, rounded to the destination dtype (RNE).
void read_packed_output(const TensorGroup& g, const ExpectedOutput& o, MissingOutput missing) {
  const std::string what = g.path() + (g.path().back() == '/' ? "" : "/") + o.name;
  if (!g.has_link(o.name)) {
    if (missing == MissingOutput::kCrashed) throw std::runtime_error(what + ": missing dataset");
    // A wrong answer, not an unreadable file: say what came instead (o_lat in
    // place of o is a dense decode's answer).
    std::string held;
    try {
      for (const std::string& n : g.list_names(64)) held += (held.empty() ? "" : ", ") + n;
    } catch (const std::exception&) {
      held = "more than 64 objects";
    }
    throw WrongOutputError(o.name + " is missing (the group holds " + (held.empty() ? std::string("nothing") : held) + ")");
  }
  const StoredDataset ds = g.open_dataset(o.name);
  const StoredType& type = ds.type();
  const std::vector<std::uint64_t>& dims = ds.dims();
  const std::vector<std::uint64_t> want(o.dest.shape.begin(), o.dest.shape.end());
  const std::string name(dtype_name(o.dest.dtype));
  if (!ds.is_simple() || dims != want)
    throw WrongOutputError(o.name + " has shape " + (ds.is_simple() ? dims_str(dims) : std::string("(scalar or null)")) +
                           ", expected " + dims_str(want));
  const std::int64_t n = o.dest.numel();
  const std::string stored = type_str(type);
  const bool bits16 = o.dest.dtype == DType::kBF16 || o.dest.dtype == DType::kF16;
  using C = StoredType::Class;

  if (type.cls == C::kInteger && type.is_unsigned && type.size == dtype_size(o.dest.dtype) &&
      (bits16 || o.dest.dtype == DType::kU8)) {
    // Raw bits: 16-bit floats must say which format they are.
    if (bits16) {
      const std::string attr = ds.has_attr("dtype") ? ds.read_text_attr("dtype", 64) : "";
      if (attr != name)
        throw WrongOutputError(o.name + " is " + stored + " with dtype attribute '" + attr + "', expected '" + name +
                               "' (its raw bits) or a float type");
    }
    if (n > 0) ds.read(bits16 ? ReadAs::kU16 : ReadAs::kU8, o.dest.data);
    return;
  }
  if (type.cls == C::kFloat && (bits16 || o.dest.dtype == DType::kF32)) {
    std::vector<float> v(static_cast<std::size_t>(n));
    if (n > 0) ds.read(ReadAs::kF32, v.data());
    if (o.dest.dtype == DType::kF32) {
      std::memcpy(o.dest.data, v.data(), v.size() * sizeof(float));
    } else {
      auto* dst = static_cast<std::uint16_t*>(o.dest.data);
      for (std::size_t i = 0; i < v.size(); ++i)
        dst[i] = o.dest.dtype == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    }
    return;
  }
  throw WrongOutputError(o.name + " is stored as " + stored + ", expected " + name +
                         (bits16 ? " (uint16 bits with a dtype attribute, or a float type)"
                                 : o.dest.dtype == DType::kF32 ? " (a float type)" : ""));
}

// A strided destination (a backend that declares strided_views; SCHEMA.md,
// "Strided views") takes either form: the view's shape, unpacked into its
// elements, or its whole span as one flat dataset (the program wrote into the
// larger buffer, as a kernel writes into vLLM's output slice), copied over
// the span: padding included, where the harness checks it untouched.
void read_output(const TensorGroup& g, const ExpectedOutput& o, MissingOutput missing) {
  if (o.dest.contiguous()) return read_packed_output(g, o, missing);
  const std::int64_t span = static_cast<std::int64_t>(o.dest.span_bytes() / dtype_size(o.dest.dtype));
  if (g.has_link(o.name)) {
    const StoredDataset ds = g.open_dataset(o.name);
    if (ds.is_simple() && ds.dims() == std::vector<std::uint64_t>{static_cast<std::uint64_t>(span)}) {
      read_packed_output(g, {o.name, TensorView{o.dest.dtype, {span}, o.dest.data}}, missing);
      return;
    }
  }
  Tensor packed(o.dest.dtype, o.dest.shape);
  read_packed_output(g, {o.name, packed.view()}, missing);
  o.dest.unpack_from(packed.bytes());
}

}  // namespace

void add_strided_input(BundleCall& call, const std::string& name, const TensorView& v) {
  if (v.contiguous()) {
    call.inputs.push_back({name, v});
    return;
  }
  const std::int64_t span = static_cast<std::int64_t>(v.span_bytes() / dtype_size(v.dtype));
  call.inputs.push_back({name, TensorView{v.dtype, {span}, v.data}});
  call.strides.push_back({name + "_strides", std::vector<std::int64_t>(v.strides.begin(), v.strides.end())});
}

int bundle_schema_version(std::span<const BundleCall> calls) {
  for (const BundleCall& c : calls)
    if (is_sparse_op(c.problem.op)) return kBundleSchemaVersion;
  return kBundleSchemaVersionDense;
}

void write_bundle(const std::string& path, const std::string& backend, std::span<const BundleCall> calls) {
  TensorFile f = TensorFile::create(path);
  TensorGroup root = f.root();
  root.write_attr("schema", kBundleSchema);
  root.write_attr("schema_version", bundle_schema_version(calls));
  root.write_attr("backend", backend);
  root.write_attr("mlagate_version", MLAGATE_VERSION);
  root.write_attr("num_calls", static_cast<std::int64_t>(calls.size()));
  TensorGroup cg = root.create_group("calls");
  for (std::size_t i = 0; i < calls.size(); ++i) {
    TensorGroup g = cg.create_group(std::to_string(i));
    write_problem(g, calls[i].problem);
    for (const auto& [aname, v] : calls[i].int_attrs) g.write_attr(aname, v);
    for (const auto& [tname, view] : calls[i].inputs) {
      if (!view.contiguous()) throw std::logic_error("write_bundle: " + tname + " is a strided view (add_strided_input)");
      g.write_tensor(tname, view.dtype, view.shape, view.data);
    }
    for (const auto& [tname, st] : calls[i].strides)
      g.write_tensor(tname, DType::kI64, {static_cast<std::int64_t>(st.size())}, st.data());
  }
  f.close();
}

CallOutcome read_outputs(const std::string& path, std::size_t index, std::span<const ExpectedOutput> outputs,
                         MissingOutput missing) {
  if (!std::filesystem::is_regular_file(path)) throw std::runtime_error("no outputs file " + path);
  const TensorFile f = TensorFile::open_read(path);
  const TensorGroup calls = f.root().open_group("calls");
  const TensorGroup g = calls.open_group(std::to_string(index));
  CallOutcome out;
  if (g.has_attr("status")) out.status = g.read_text_attr("status", 64);
  if (g.has_attr("message")) out.message = g.read_text_attr("message", 4096);
  if (out.status != "ok" && out.status != "not_supported" && out.status != "error" && out.status != "unavailable")
    throw std::runtime_error(g.path() + ": status '" + out.status + "' is not ok, not_supported, error or unavailable");
  if (out.status != "ok") return out;
  for (const ExpectedOutput& o : outputs) read_output(g, o, missing);
  return out;
}

}  // namespace mlagate::exec
