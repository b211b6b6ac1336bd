// Bundle writing and outputs reading over golden/'s RAII HDF5 layer (the
// checked calls of golden/detail/h5.h and the typed datasets and attributes of
// golden/detail/io.h): bundles store tensors exactly as golden files do
// (16-bit floats as uint16 bits with a dtype attribute).
#include "backends/exec/bundle.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "golden/detail/h5.h"
#include "golden/detail/io.h"
#include "mlagate/config.h"

namespace mlagate::exec {

namespace h5 = golden::h5;
namespace io = golden::io;

namespace {

std::string query_len_name(std::uint32_t q) {
  return q == MLAGATE_QUERY_LEN_SINGLE_ONLY ? "SINGLE_ONLY" : q == MLAGATE_QUERY_LEN_UNIFORM ? "UNIFORM" : "VARLEN";
}

void write_problem(hid_t g, const plugin::Problem& p, const io::Where& w) {
  const mlagate_problem c = p.to_c(DLDevice{kDLCPU, 0});
  io::write_attr(g, "op", std::string(op_name(p.op)), w);
  io::write_attr(g, "case_id", p.case_id, w);
  io::write_attr(g, "kv_lora_rank", c.kv_lora_rank, w);
  io::write_attr(g, "rope_dim", c.rope_dim, w);
  io::write_attr(g, "nope_dim", c.nope_dim, w);
  io::write_attr(g, "v_head_dim", c.v_head_dim, w);
  io::write_attr(g, "num_heads", c.num_heads, w);
  io::write_attr(g, "num_requests", c.num_requests, w);
  io::write_attr(g, "num_tokens", c.num_tokens, w);
  io::write_attr(g, "num_kv_tokens", static_cast<std::int64_t>(c.num_kv_tokens), w);
  io::write_attr(g, "max_seq_len", c.max_seq_len, w);
  io::write_attr(g, "max_query_len", c.max_query_len, w);
  io::write_attr(g, "query_len_support", query_len_name(c.query_len_support), w);
  io::write_attr(g, "reorder_threshold", c.reorder_threshold, w);
  io::write_attr(g, "spec_decode", c.spec_decode, w);
  io::write_attr(g, "dtype", std::string(dtype_name(p.dtype)), w);
  io::write_attr(g, "kv_cache_dtype", std::string(kv_cache_dtype_name(p.kv.dtype)), w);
  io::write_attr(g, "scale_rule", std::string(scale_rule_name(p.kv.scale_rule)), w);
  io::write_attr(g, "block_size", c.block_size, w);
  io::write_attr(g, "entry_bytes", c.entry.bytes, w);
  io::write_attr(g, "kv_c_offset", c.entry.kv_c_offset, w);
  io::write_attr(g, "kv_c_elem_bytes", c.entry.kv_c_elem_bytes, w);
  io::write_attr(g, "k_pe_offset", c.entry.k_pe_offset, w);
  io::write_attr(g, "k_pe_elem_bytes", c.entry.k_pe_elem_bytes, w);
  io::write_attr(g, "scale_offset", c.entry.scale_offset, w);
  io::write_attr(g, "scale_count", c.entry.scale_count, w);
  io::write_attr(g, "scale", c.scale, w);
  io::write_attr(g, "k_scale", static_cast<double>(c.k_scale), w);
  io::write_attr(g, "causal", c.causal, w);
  const std::int64_t b = static_cast<std::int64_t>(p.seq_lens.size());
  io::write_dataset(g, "seq_lens", DType::kI32, {b}, p.seq_lens.data(), w);
  io::write_dataset(g, "query_lens", DType::kI32, {b}, p.query_lens.data(), w);
}

std::string read_text_attr(hid_t loc, const std::string& name, const io::Where& w, std::size_t max_len);

std::string dims_str(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

std::string type_str(H5T_class_t cls, std::size_t size, H5T_sign_t sign) {
  const char* c = cls == H5T_FLOAT     ? "float"
                  : cls == H5T_INTEGER ? (sign == H5T_SGN_NONE ? "uint" : "int")
                  : cls == H5T_STRING  ? "string"
                                       : "non-numeric";
  return std::string(c) + std::to_string(size * 8);
}

// One output dataset into its destination view, converting what a program may
// reasonably write: the dtype's own bits (16-bit floats as uint16 with a
// dtype attribute), or any float type, rounded to the destination dtype (RNE).
void read_output(hid_t g, const ExpectedOutput& o, const io::Where& parent, MissingOutput missing) {
  const io::Where w = parent / o.name;
  const std::string what = w.str();
  if (!io::has_link(g, o.name, parent)) {
    if (missing == MissingOutput::kCrashed) throw std::runtime_error(what + ": missing dataset");
    // A wrong answer, not an unreadable file: say what came instead (o_lat in
    // place of o is a dense decode's answer).
    std::string held;
    try {
      for (const std::string& n : h5::list_links(g, parent.str(), 64)) held += (held.empty() ? "" : ", ") + n;
    } catch (const std::exception&) {
      held = "more than 64 objects";
    }
    throw WrongOutputError(o.name + " is missing (the group holds " + (held.empty() ? std::string("nothing") : held) + ")");
  }
  const h5::Dataset ds = h5::dopen(g, o.name, what);
  const h5::Datatype t = h5::dget_type(ds, what);
  const H5T_class_t cls = h5::tget_class(t, what);
  const std::size_t size = h5::tget_size(t, what);
  const H5T_sign_t sign = cls == H5T_INTEGER ? h5::tget_sign(t, what) : H5T_SGN_ERROR;
  const h5::Dataspace space = h5::dget_space(ds, what);
  const H5S_class_t sc = h5::sget_class(space, what);
  const std::vector<hsize_t> dims = sc == H5S_SIMPLE ? h5::sget_dims(space, what) : std::vector<hsize_t>{};
  const std::vector<hsize_t> want(o.dest.shape.begin(), o.dest.shape.end());
  const std::string name(dtype_name(o.dest.dtype));
  if (sc != H5S_SIMPLE || dims != want)
    throw WrongOutputError(o.name + " has shape " + (sc == H5S_SIMPLE ? dims_str(dims) : std::string("(scalar or null)")) +
                           ", expected " + dims_str(want));
  const std::int64_t n = o.dest.numel();
  const std::string stored = type_str(cls, size, sign);
  const bool bits16 = o.dest.dtype == DType::kBF16 || o.dest.dtype == DType::kF16;

  if (cls == H5T_INTEGER && sign == H5T_SGN_NONE && size == dtype_size(o.dest.dtype) &&
      (bits16 || o.dest.dtype == DType::kU8)) {
    // Raw bits: 16-bit floats must say which format they are.
    if (bits16) {
      const std::string attr = io::has_attr(ds.get(), "dtype", w) ? read_text_attr(ds.get(), "dtype", w, 64) : "";
      if (attr != name)
        throw WrongOutputError(o.name + " is " + stored + " with dtype attribute '" + attr + "', expected '" + name +
                               "' (its raw bits) or a float type");
    }
    if (n > 0) h5::dread(ds, bits16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT8, o.dest.data, what);
    return;
  }
  if (cls == H5T_FLOAT && (bits16 || o.dest.dtype == DType::kF32)) {
    std::vector<float> v(static_cast<std::size_t>(n));
    if (n > 0) h5::dread(ds, H5T_NATIVE_FLOAT, v.data(), what);
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

// A string attribute written by any HDF5 library: fixed length (as golden/
// writes them) or variable length (h5py's default for str).
std::string read_text_attr(hid_t loc, const std::string& name, const io::Where& w, std::size_t max_len) {
  const std::string what = w.str() + "@" + name;
  const h5::Attribute a = h5::aopen(loc, name, what);
  const h5::Datatype t = h5::aget_type(a, what);
  if (h5::tget_class(t, what) != H5T_STRING) throw std::runtime_error(what + ": not a string attribute");
  if (!h5::tis_variable_str(t, what)) return io::read_string(loc, name, w, max_len);
  const h5::Dataspace space = h5::aget_space(a, what);
  const H5S_class_t sc = h5::sget_class(space, what);
  const bool one = sc == H5S_SCALAR || (sc == H5S_SIMPLE && h5::sget_dims(space, what) == std::vector<hsize_t>{1});
  if (!one) throw std::runtime_error(what + ": not a single string");
  const h5::Datatype mem = h5::tcopy(H5T_C_S1, what);
  h5::tset_size(mem, H5T_VARIABLE, what);
  h5::tset_cset(mem, H5Tget_cset(t.get()), what);
  char* p = nullptr;
  h5::aread(a, mem.get(), &p, what);
  std::string out = p ? std::string(p, strnlen(p, max_len)) : std::string();
  H5free_memory(p);
  for (char& ch : out)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  return out;
}

}  // namespace

int bundle_schema_version(std::span<const BundleCall> calls) {
  for (const BundleCall& c : calls)
    if (is_sparse_op(c.problem.op)) return kBundleSchemaVersion;
  return kBundleSchemaVersionDense;
}

void write_bundle(const std::string& path, const std::string& backend, std::span<const BundleCall> calls) {
  h5::init();
  const io::Where root{path, "/"};
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "file access properties");
  h5::File f = h5::fcreate(path, fapl);
  io::write_attr(f.get(), "schema", kBundleSchema, root);
  io::write_attr(f.get(), "schema_version", bundle_schema_version(calls), root);
  io::write_attr(f.get(), "backend", backend, root);
  io::write_attr(f.get(), "mlagate_version", MLAGATE_VERSION, root);
  io::write_attr(f.get(), "num_calls", static_cast<std::int64_t>(calls.size()), root);
  const h5::Group cg = io::create_group(f.get(), "calls", root);
  const io::Where cw = root / "calls";
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const std::string name = std::to_string(i);
    const h5::Group g = io::create_group(cg.get(), name, cw);
    const io::Where w = cw / name;
    write_problem(g.get(), calls[i].problem, w);
    for (const auto& [aname, v] : calls[i].int_attrs) io::write_attr(g.get(), aname, v, w);
    for (const auto& [tname, view] : calls[i].inputs)
      io::write_dataset(g.get(), tname, view.dtype, view.shape, view.data, w);
  }
  f.close("H5Fclose", path);
}

CallOutcome read_outputs(const std::string& path, std::size_t index, std::span<const ExpectedOutput> outputs,
                         MissingOutput missing) {
  h5::init();
  if (!std::filesystem::is_regular_file(path)) throw std::runtime_error("no outputs file " + path);
  const io::Where root{path, "/"};
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "file access properties");
  const h5::File f = h5::fopen(path, H5F_ACC_RDONLY, fapl);
  const h5::Group calls = io::open_group(f.get(), "calls", root);
  const io::Where cw = root / "calls";
  const std::string name = std::to_string(index);
  const h5::Group g = io::open_group(calls.get(), name, cw);
  const io::Where w = cw / name;
  CallOutcome out;
  if (io::has_attr(g.get(), "status", w)) out.status = read_text_attr(g.get(), "status", w, 64);
  if (io::has_attr(g.get(), "message", w)) out.message = read_text_attr(g.get(), "message", w, 4096);
  if (out.status != "ok" && out.status != "not_supported" && out.status != "error" && out.status != "unavailable")
    throw std::runtime_error(w.str() + ": status '" + out.status + "' is not ok, not_supported, error or unavailable");
  if (out.status != "ok") return out;
  for (const ExpectedOutput& o : outputs) read_output(g.get(), o, w, missing);
  return out;
}

}  // namespace mlagate::exec
