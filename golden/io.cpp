// Typed attributes and datasets over the checked HDF5 calls, with the storage
// policy on the write side and the validation on the read side.
#include "golden/detail/io.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace mlagate::golden::io {

namespace {

// Datasets up to this size live inside their object header (compact layout),
// which HDF5 checksums; larger ones are chunked with a fletcher32 filter.
constexpr std::size_t kCompactMaxBytes = 32 * 1024;
constexpr double kChunkTargetBytes = 1 << 20;
constexpr double kMaxChunkBytes = 64.0 * (1 << 20);
constexpr unsigned kDeflateLevel = 1;  // random bf16 data barely compresses: favour speed
constexpr int kMaxRank = 8;

struct Storage {
  hid_t file_type, mem_type;
  H5T_class_t cls;
  std::size_t size;
  H5T_sign_t sign;
};

Storage storage_of(DType d) {
  switch (d) {
    case DType::kF64: return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, H5T_FLOAT, 8, H5T_SGN_ERROR};
    case DType::kF32: return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, H5T_FLOAT, 4, H5T_SGN_ERROR};
    case DType::kI32: return {H5T_STD_I32LE, H5T_NATIVE_INT32, H5T_INTEGER, 4, H5T_SGN_2};
    case DType::kI64: return {H5T_STD_I64LE, H5T_NATIVE_INT64, H5T_INTEGER, 8, H5T_SGN_2};
    default: break;
  }
  // bf16, fp16, fp8 and raw bytes: their bits as unsigned integers of the same width.
  switch (dtype_size(d)) {
    case 1: return {H5T_STD_U8LE, H5T_NATIVE_UINT8, H5T_INTEGER, 1, H5T_SGN_NONE};
    case 2: return {H5T_STD_U16LE, H5T_NATIVE_UINT16, H5T_INTEGER, 2, H5T_SGN_NONE};
    case 4: return {H5T_STD_U32LE, H5T_NATIVE_UINT32, H5T_INTEGER, 4, H5T_SGN_NONE};
    default: return {H5T_STD_U64LE, H5T_NATIVE_UINT64, H5T_INTEGER, 8, H5T_SGN_NONE};
  }
}

std::string type_str(H5T_class_t cls, std::size_t size, H5T_sign_t sign) {
  const char* c = cls == H5T_FLOAT ? "float" : cls == H5T_INTEGER ? (sign == H5T_SGN_NONE ? "uint" : "int")
                  : cls == H5T_STRING ? "string" : "other";
  return std::string(c) + std::to_string(size * 8);
}

std::string dims_str(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

h5::Datatype string_type(std::size_t len, const Where& w) {
  h5::Datatype t = h5::tcopy(H5T_C_S1, w.str());
  h5::tset_size(t, std::max<std::size_t>(1, len), w.str());
  h5::tset_strpad(t, H5T_STR_NULLPAD, w.str());
  h5::tset_cset(t, H5T_CSET_UTF8, w.str());
  return t;
}

void write_scalar_attr(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type, const void* v,
                       const Where& w) {
  const std::string what = w.str() + "@" + name;
  const h5::Dataspace space = h5::screate_scalar(what);
  const h5::Attribute a = h5::acreate(loc, name, file_type, space, what);
  h5::awrite(a, mem_type, v, what);
}

// Dataspace of an attribute must hold exactly one element.
h5::Attribute open_scalar_attr(hid_t loc, const std::string& name, const Where& w, H5T_class_t want,
                               h5::Datatype& type) {
  const std::string what = w.str() + "@" + name;
  if (!h5::aexists(loc, name, what)) bad(w, "missing attribute '" + name + "'");
  h5::Attribute a = h5::aopen(loc, name, what);
  type = h5::aget_type(a, what);
  const H5T_class_t cls = h5::tget_class(type, what);
  const bool ok = cls == want || (want == H5T_FLOAT && cls == H5T_INTEGER);
  if (!ok) bad(w, "attribute '" + name + "' has the wrong type (" + type_str(cls, h5::tget_size(type, what), H5T_SGN_2) + ")");
  const h5::Dataspace space = h5::aget_space(a, what);
  const H5S_class_t sc = h5::sget_class(space, what);
  if (sc == H5S_SIMPLE) {
    const auto dims = h5::sget_dims(space, what);
    if (!(dims.size() == 1 && dims[0] == 1)) bad(w, "attribute '" + name + "' is not a single value " + dims_str(dims));
  } else if (sc != H5S_SCALAR) {
    bad(w, "attribute '" + name + "' holds no value");
  }
  return a;
}

h5::Dataset open_dataset(hid_t loc, const std::string& name, const Where& parent) {
  if (!has_link(loc, name, parent)) bad(parent / name, "missing dataset");
  return h5::dopen(loc, name, (parent / name).str());
}

std::vector<hsize_t> checked_dims(const h5::Dataset& ds, const Where& w) {
  const h5::Dataspace space = h5::dget_space(ds, w.str());
  const H5S_class_t sc = h5::sget_class(space, w.str());
  if (sc == H5S_SCALAR) return {};
  if (sc != H5S_SIMPLE) bad(w, "dataset has no extent");
  std::vector<hsize_t> dims = h5::sget_dims(space, w.str());
  if (dims.size() > kMaxRank) bad(w, "rank " + std::to_string(dims.size()) + " > " + std::to_string(kMaxRank));
  for (hsize_t d : dims)
    if (d > (hsize_t{1} << 40)) bad(w, "absurd extent " + dims_str(dims));
  return dims;
}

// The registered names of filters a foreign writer may have used, so that the
// message says what the file asks for (h5py's lzf is the usual one).
std::string filter_label(H5Z_filter_t f) {
  switch (f) {
    case H5Z_FILTER_SZIP: return " (szip)";
    case H5Z_FILTER_NBIT: return " (nbit)";
    case H5Z_FILTER_SCALEOFFSET: return " (scaleoffset)";
    case 307: return " (bzip2)";
    case 32000: return " (lzf)";
    case 32001: return " (blosc)";
    case 32004: return " (lz4)";
    case 32008: return " (bitshuffle)";
    case 32015: return " (zstd)";
    default: return "";
  }
}

// Storage a reader accepts: in this file, no external or virtual storage, only
// the portable filters this schema writes, bounded chunk sizes.
void check_storage(const h5::Dataset& ds, std::size_t elem, const Where& w) {
  const h5::PropList dcpl = h5::dget_create_plist(ds, w.str());
  const H5D_layout_t layout = h5::get_layout(dcpl, w.str());
  if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED)
    bad(w, "unsupported storage layout (virtual or unknown)");
  if (h5::get_external_count(dcpl, w.str()) != 0) bad(w, "external storage is not accepted");
  const int nf = h5::get_nfilters(dcpl, w.str());
  if (nf > 8) bad(w, "too many filters");
  for (int i = 0; i < nf; ++i) {
    const H5Z_filter_t f = h5::get_filter(dcpl, static_cast<unsigned>(i), w.str());
    if (f != H5Z_FILTER_DEFLATE && f != H5Z_FILTER_SHUFFLE && f != H5Z_FILTER_FLETCHER32)
      bad(w, "filter " + std::to_string(f) + filter_label(f) + " is not one of deflate, shuffle, fletcher32");
  }
  if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk;
    h5::get_chunk(dcpl, chunk, w.str());
    double bytes = static_cast<double>(elem);
    for (hsize_t c : chunk) {
      if (c < 1) bad(w, "zero chunk extent");
      bytes *= static_cast<double>(c);
    }
    if (bytes > kMaxChunkBytes) bad(w, "chunks of " + std::to_string(static_cast<long long>(bytes)) + " bytes are too large");
  }
}

}  // namespace

void bad(const Where& w, const std::string& why) { throw GoldenFileError(w.str() + ": " + why); }

void Budget::take(double bytes, const Where& w) {
  if (!(bytes >= 0) || bytes > static_cast<double>(left_))
    bad(w, "reading it would exceed the memory budget of " + std::to_string(max_) + " bytes (--max-bytes)");
  left_ -= static_cast<std::uint64_t>(bytes);
}

void write_attr(hid_t loc, const std::string& name, std::int64_t v, const Where& w) {
  write_scalar_attr(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, w);
}
void write_attr_u64(hid_t loc, const std::string& name, std::uint64_t v, const Where& w) {
  write_scalar_attr(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, w);
}
void write_attr(hid_t loc, const std::string& name, double v, const Where& w) {
  write_scalar_attr(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, w);
}
void write_attr(hid_t loc, const std::string& name, const std::string& v, const Where& w) {
  const h5::Datatype t = string_type(v.size(), w);
  std::string buf = v;
  if (buf.empty()) buf.push_back('\0');
  write_scalar_attr(loc, name, t.get(), t.get(), buf.data(), w);
}

h5::Group create_group(hid_t loc, const std::string& name, const Where& w) { return h5::gcreate(loc, name, (w / name).str()); }

namespace {

std::uint64_t write_raw(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type, std::size_t elem,
                        const std::vector<hsize_t>& dims, const void* data, const std::string& dtype_attr,
                        const Where& parent, Compress compress = Compress::kGzip) {
  const Where w = parent / name;
  double numel = 1;
  for (hsize_t d : dims) numel *= static_cast<double>(d);
  const std::size_t nbytes = static_cast<std::size_t>(numel) * elem;
  const h5::Dataspace space = h5::screate_simple(dims, w.str());
  const h5::PropList dcpl = h5::pcreate(H5P_DATASET_CREATE, w.str());
  h5::set_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  if (nbytes <= kCompactMaxBytes) {
    h5::set_layout(dcpl, H5D_COMPACT);
  } else {
    std::vector<hsize_t> chunk = dims;
    double bytes = static_cast<double>(nbytes);
    for (std::size_t i = 0; i < chunk.size() && bytes > kChunkTargetBytes; ++i) {
      const double slice = bytes / static_cast<double>(chunk[i]);
      chunk[i] = std::min<hsize_t>(chunk[i], std::max<hsize_t>(1, static_cast<hsize_t>(kChunkTargetBytes / slice)));
      bytes = slice * static_cast<double>(chunk[i]);
    }
    h5::set_chunk(dcpl, chunk);
    if (compress == Compress::kGzip) {
      h5::set_shuffle(dcpl);
      h5::set_deflate(dcpl, kDeflateLevel);
    }
    h5::set_fletcher32(dcpl);
  }
  const h5::Dataset ds = h5::dcreate(loc, name, file_type, space, dcpl, w.str());
  if (nbytes > 0) h5::dwrite(ds, mem_type, data, w.str());
  const std::uint64_t hash = fnv1a64(data, nbytes);
  write_attr(ds.get(), "dtype", dtype_attr, w);
  write_attr(ds.get(), "fnv1a64", hash_hex(hash), w);
  write_attr(ds.get(), "xxh64", hash_hex(xxh64(data, nbytes)), w);
  return hash;
}

}  // namespace

std::uint64_t write_dataset(hid_t loc, const std::string& name, DType dtype, const Shape& shape, const void* data,
                            const Where& w, Compress compress) {
  const Storage st = storage_of(dtype);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return write_raw(loc, name, st.file_type, st.mem_type, st.size, dims, data, std::string(dtype_name(dtype)), w, compress);
}

void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& v, const Where& w) {
  std::size_t len = 1;
  for (const auto& s : v) len = std::max(len, s.size());
  std::vector<char> buf(v.size() * len, '\0');
  for (std::size_t i = 0; i < v.size(); ++i) std::memcpy(buf.data() + i * len, v[i].data(), v[i].size());
  const h5::Datatype t = string_type(len, w / name);
  write_raw(loc, name, t.get(), t.get(), len, {static_cast<hsize_t>(v.size())}, buf.data(), "string", w);
}

bool has_attr(hid_t loc, const std::string& name, const Where& w) { return h5::aexists(loc, name, w.str() + "@" + name); }

std::int64_t read_int(hid_t loc, const std::string& name, const Where& w, std::int64_t lo, std::int64_t hi) {
  h5::Datatype t;
  const h5::Attribute a = open_scalar_attr(loc, name, w, H5T_INTEGER, t);
  std::int64_t v = 0;
  h5::aread(a, H5T_NATIVE_INT64, &v, w.str() + "@" + name);
  if (v < lo || v > hi)
    bad(w, "attribute '" + name + "' = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "]");
  return v;
}

std::uint64_t read_u64(hid_t loc, const std::string& name, const Where& w) {
  h5::Datatype t;
  const h5::Attribute a = open_scalar_attr(loc, name, w, H5T_INTEGER, t);
  std::uint64_t v = 0;
  h5::aread(a, H5T_NATIVE_UINT64, &v, w.str() + "@" + name);
  return v;
}

double read_double(hid_t loc, const std::string& name, const Where& w) {
  h5::Datatype t;
  const h5::Attribute a = open_scalar_attr(loc, name, w, H5T_FLOAT, t);
  double v = 0;
  h5::aread(a, H5T_NATIVE_DOUBLE, &v, w.str() + "@" + name);
  return v;
}

std::string read_string(hid_t loc, const std::string& name, const Where& w, std::size_t max_len) {
  h5::Datatype t;
  const h5::Attribute a = open_scalar_attr(loc, name, w, H5T_STRING, t);
  const std::string what = w.str() + "@" + name;
  if (h5::tis_variable_str(t, what)) bad(w, "attribute '" + name + "' is a variable-length string (fixed-length expected)");
  const std::size_t size = h5::tget_size(t, what);
  if (size > max_len) bad(w, "attribute '" + name + "' is longer than " + std::to_string(max_len) + " bytes");
  std::string buf(size, '\0');
  h5::aread(a, t.get(), buf.data(), what);
  if (h5::tget_strpad(t, what) == H5T_STR_SPACEPAD) {
    while (!buf.empty() && buf.back() == ' ') buf.pop_back();
  } else {
    buf.resize(std::strlen(buf.c_str()));
  }
  return buf;
}

std::uint64_t read_hash(hid_t loc, const std::string& name, const Where& w) {
  const std::string s = read_string(loc, name, w, 64);
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    bad(w, "attribute '" + name + "' is not a 16-digit hex hash");
  return std::stoull(s, nullptr, 16);
}

ContentHash read_content_hash(hid_t ds, const Where& w) {
  // fnv1a64 must be well-formed even where xxh64 is the hash checked: a
  // reader that checks FNV only (older mlagate, a script) reads the same file.
  ContentHash h{ContentHash::Kind::kFnv1a64, read_hash(ds, "fnv1a64", w)};
  if (has_attr(ds, "xxh64", w)) h = {ContentHash::Kind::kXxh64, read_hash(ds, "xxh64", w)};
  return h;
}

bool has_link(hid_t loc, const std::string& name, const Where& w) {
  const std::string what = (w / name).str();
  if (!h5::lexists(loc, name, what)) return false;
  if (h5::link_type(loc, name, what) != H5L_TYPE_HARD) bad(w / name, "is a soft or external link (only hard links are followed)");
  return true;
}

h5::Group open_group(hid_t loc, const std::string& name, const Where& w) {
  if (!has_link(loc, name, w)) bad(w / name, "missing group");
  return h5::gopen(loc, name, (w / name).str());
}

std::vector<std::string> list_group(hid_t loc, const Where& w, std::size_t max_names) {
  std::vector<std::string> names = h5::list_links(loc, w.str(), max_names);
  for (const auto& n : names)
    for (unsigned char ch : n)
      if (ch < 0x20 || ch == 0x7f) bad(w, "a member name holds a control character");
  return names;
}

std::string dataset_dtype_attr(hid_t loc, const std::string& name, const Where& w) {
  const h5::Dataset ds = open_dataset(loc, name, w);
  return read_string(ds.get(), "dtype", w / name, 64);
}

Shape dataset_shape(hid_t loc, const std::string& name, const Where& w) {
  const h5::Dataset ds = open_dataset(loc, name, w);
  const auto dims = checked_dims(ds, w / name);
  return Shape(dims.begin(), dims.end());
}

namespace {

// read_tensor's checks of everything but the content; returns the stored hash.
ContentHash check_dataset(const h5::Dataset& ds, DType dtype, const Shape& shape, const Where& w) {
  const Storage st = storage_of(dtype);
  const h5::Datatype t = h5::dget_type(ds, w.str());
  const H5T_class_t cls = h5::tget_class(t, w.str());
  const std::size_t size = h5::tget_size(t, w.str());
  const H5T_sign_t sign = cls == H5T_INTEGER ? h5::tget_sign(t, w.str()) : H5T_SGN_ERROR;
  if (cls != st.cls || size != st.size || (cls == H5T_INTEGER && sign != st.sign))
    bad(w, "stored as " + type_str(cls, size, sign) + ", expected " + type_str(st.cls, st.size, st.sign) + " (" +
               std::string(dtype_name(dtype)) + ")");
  const auto dims = checked_dims(ds, w);
  const std::vector<hsize_t> want(shape.begin(), shape.end());
  if (dims != want) bad(w, "shape " + dims_str(dims) + " disagrees with the case's attributes, which give " + dims_str(want));
  check_storage(ds, st.size, w);
  const std::string dt = read_string(ds.get(), "dtype", w, 64);
  if (dt != dtype_name(dtype)) bad(w, "dtype attribute '" + dt + "', expected '" + std::string(dtype_name(dtype)) + "'");
  return read_content_hash(ds.get(), w);
}

}  // namespace

void check_tensor(hid_t loc, const std::string& name, DType dtype, const Shape& shape, const Where& parent) {
  const Where w = parent / name;
  if (!has_link(loc, name, parent)) bad(w, "missing dataset");
  const h5::Dataset ds = h5::dopen(loc, name, w.str());
  check_dataset(ds, dtype, shape, w);
}

std::vector<double> f64_values(const Tensor& t) {
  const double* p = t.data<double>();
  return {p, p + t.numel()};
}

std::vector<std::int32_t> i32_values(const Tensor& t) {
  const auto* p = t.data<std::int32_t>();
  return {p, p + t.numel()};
}

Tensor read_tensor(hid_t loc, const std::string& name, DType dtype, const Shape& shape, const Where& parent,
                   Budget& budget, ContentHash* hash_out) {
  const Where w = parent / name;
  if (!has_link(loc, name, parent)) bad(w, "missing dataset");
  const h5::Dataset ds = h5::dopen(loc, name, w.str());
  const Storage st = storage_of(dtype);
  const ContentHash stored = check_dataset(ds, dtype, shape, w);
  double bytes = static_cast<double>(st.size);
  for (auto d : shape) bytes *= static_cast<double>(d);
  budget.take(bytes, w);
  Tensor out(dtype, shape);
  if (out.nbytes() > 0) h5::dread(ds, st.mem_type, out.bytes(), w.str());
  const ContentHash h = ContentHash::of(stored.kind, out.bytes(), out.nbytes());
  if (h != stored) bad(w, "content hash " + h.str() + " differs from the stored " + hash_hex(stored.value) + " (corrupt file)");
  if (hash_out) *hash_out = h;
  return out;
}

std::vector<std::string> read_strings(hid_t loc, const std::string& name, const Where& parent, std::size_t max_count,
                                      std::size_t max_len, Budget& budget) {
  const Where w = parent / name;
  if (!has_link(loc, name, parent)) bad(w, "missing dataset");
  const h5::Dataset ds = h5::dopen(loc, name, w.str());
  const h5::Datatype t = h5::dget_type(ds, w.str());
  if (h5::tget_class(t, w.str()) != H5T_STRING || h5::tis_variable_str(t, w.str()))
    bad(w, "not a fixed-length string dataset");
  const std::size_t len = h5::tget_size(t, w.str());
  if (len > max_len) bad(w, "strings longer than " + std::to_string(max_len) + " bytes");
  const auto dims = checked_dims(ds, w);
  if (dims.size() != 1) bad(w, "not one-dimensional " + dims_str(dims));
  if (dims[0] > max_count) bad(w, "more than " + std::to_string(max_count) + " entries");
  check_storage(ds, len, w);
  const ContentHash stored = read_content_hash(ds.get(), w);
  budget.take(static_cast<double>(dims[0]) * static_cast<double>(len), w);
  std::vector<char> buf(static_cast<std::size_t>(dims[0]) * len, '\0');
  if (!buf.empty()) h5::dread(ds, t.get(), buf.data(), w.str());
  const ContentHash h = ContentHash::of(stored.kind, buf.data(), buf.size());
  if (h != stored) bad(w, "content hash " + h.str() + " differs from the stored " + hash_hex(stored.value) + " (corrupt file)");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < dims[0]; ++i) {
    const char* p = buf.data() + i * len;
    out.emplace_back(p, strnlen(p, len));
  }
  return out;
}

}  // namespace mlagate::golden::io
