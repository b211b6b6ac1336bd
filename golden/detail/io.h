// Private to golden/*.cpp: typed attributes and datasets on top of h5.h, and
// the validation every read goes through (link kinds, types, shapes, storage
// layout and filters, the dtype and fnv1a64 attributes, a memory budget).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cases/tensor.h"
#include "golden/detail/h5.h"
#include "golden/golden_file.h"

namespace mlagate::golden::io {

// Where an object sits, for messages: "file.h5:/cases/<id>/inputs/q".
struct Where {
  std::string file, path;
  Where operator/(const std::string& child) const { return {file, path == "/" ? "/" + child : path + "/" + child}; }
  std::string str() const { return file + ":" + path; }
};

[[noreturn]] void bad(const Where& w, const std::string& why);  // throws GoldenFileError "file:path: why"

// Bytes a read may still allocate; every dataset read takes from it first.
class Budget {
 public:
  explicit Budget(std::uint64_t max_bytes) : left_(max_bytes), max_(max_bytes) {}
  void take(double bytes, const Where& w);
 private:
  std::uint64_t left_, max_;
};

// ---- writing
void write_attr(hid_t loc, const std::string& name, std::int64_t v, const Where& w);
void write_attr_u64(hid_t loc, const std::string& name, std::uint64_t v, const Where& w);
void write_attr(hid_t loc, const std::string& name, double v, const Where& w);
// Fixed-length, null-padded UTF-8 (never variable-length: those live in the
// global heap, which has no checksum).
void write_attr(hid_t loc, const std::string& name, const std::string& v, const Where& w);
inline void write_attr(hid_t loc, const std::string& name, const char* v, const Where& w) {
  write_attr(loc, name, std::string(v), w);
}
inline void write_attr(hid_t loc, const std::string& name, int v, const Where& w) {
  write_attr(loc, name, static_cast<std::int64_t>(v), w);
}
h5::Group create_group(hid_t loc, const std::string& name, const Where& w);
// A dataset of `dtype` elements (16-bit floats as their raw uint16 bits, other
// non-native types by size) with attributes dtype, fnv1a64 and xxh64. Small datasets
// are compact (inside the checksummed object header); the rest chunked with
// shuffle + gzip + fletcher32 (kNone: fletcher32 only). Returns the FNV-1a hash.
// References are written kNone: fp64 results that gzip shrinks by about a
// tenth, and that every run --golden reads (decompressing them cost it more
// than the rest of its reading).
enum class Compress { kGzip, kNone };
std::uint64_t write_dataset(hid_t loc, const std::string& name, DType dtype, const Shape& shape, const void* data,
                            const Where& w, Compress compress = Compress::kGzip);
inline std::uint64_t write_tensor(hid_t loc, const std::string& name, const Tensor& t, const Where& w) {
  return write_dataset(loc, name, t.dtype(), t.shape(), t.bytes(), w);
}
// Fixed-length string dataset [n].
void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& v, const Where& w);

// ---- reading (everything validated; failures throw GoldenFileError)
bool has_attr(hid_t loc, const std::string& name, const Where& w);
std::int64_t read_int(hid_t loc, const std::string& name, const Where& w, std::int64_t lo, std::int64_t hi);
std::uint64_t read_u64(hid_t loc, const std::string& name, const Where& w);
double read_double(hid_t loc, const std::string& name, const Where& w);
std::string read_string(hid_t loc, const std::string& name, const Where& w, std::size_t max_len = 1 << 16);
std::uint64_t read_hash(hid_t loc, const std::string& name, const Where& w);  // 16 hex digits
// The hash a dataset's content is checked against: xxh64 where stored, else
// fnv1a64 (which must be well-formed either way).
ContentHash read_content_hash(hid_t ds, const Where& w);
bool has_link(hid_t loc, const std::string& name, const Where& w);  // exists, and only as a hard link
h5::Group open_group(hid_t loc, const std::string& name, const Where& w);  // hard links only
// Children of a group (at most max_names, names checked printable).
std::vector<std::string> list_group(hid_t loc, const Where& w, std::size_t max_names);
// The dtype attribute of a dataset, without reading the data.
std::string dataset_dtype_attr(hid_t loc, const std::string& name, const Where& w);
// Shape of a dataset without reading it (validated rank <= 8).
Shape dataset_shape(hid_t loc, const std::string& name, const Where& w);
// Reads a dataset whose dtype and shape must be exactly these; checks storage
// (no external or virtual storage, only deflate/shuffle/fletcher32, bounded
// chunks), the dtype attribute and the content hash (read_content_hash).
Tensor read_tensor(hid_t loc, const std::string& name, DType dtype, const Shape& shape, const Where& w, Budget& budget,
                   ContentHash* hash_out = nullptr);
// A read fp64 / int32 tensor's values as a vector (what the readers keep).
std::vector<double> f64_values(const Tensor& t);
std::vector<std::int32_t> i32_values(const Tensor& t);
// Everything read_tensor checks but the content: link, dtype, shape, storage,
// the dtype attribute and well-formed hash attributes (run --golden's
// validation of stored inputs and cache data it does not read).
void check_tensor(hid_t loc, const std::string& name, DType dtype, const Shape& shape, const Where& w);
std::vector<std::string> read_strings(hid_t loc, const std::string& name, const Where& w, std::size_t max_count,
                                      std::size_t max_len, Budget& budget);

}  // namespace mlagate::golden::io
