// golden/'s public HDF5 API for other modules: files of typed tensor datasets
// and scalar or string attributes in groups, stored exactly as golden files
// store them (16-bit floats as their uint16 bits with a dtype attribute, the
// content hashes, small datasets compact), with golden's checked calls and
// messages. The exec backend's case bundles and outputs files
// (backends/exec/bundle.cpp) are written and read through it, so golden/detail
// stays golden's own. Free of hdf5.h: the handles live in golden/tensor_file.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cases/tensor.h"

namespace mlagate::golden {

// How a stored dataset's elements are typed (HDF5's class of its datatype).
struct StoredType {
  enum class Class { kInteger, kFloat, kString, kOther };
  Class cls = Class::kOther;
  std::size_t size = 0;      // bytes per element
  bool is_unsigned = false;  // integers only
};

// The memory types a stored dataset can be read into (HDF5 converts).
enum class ReadAs { kU8, kU16, kF32 };

// An open dataset of a TensorGroup, for reading: its type and shape are read
// on opening (each checked call names `path()` in its message).
class StoredDataset {
 public:
  StoredDataset(StoredDataset&&) noexcept;
  StoredDataset& operator=(StoredDataset&&) noexcept;
  ~StoredDataset();

  const std::string& path() const;  // "file.h5:/calls/0/o"
  const StoredType& type() const;
  bool is_simple() const;                        // a simple dataspace (else scalar or null)
  const std::vector<std::uint64_t>& dims() const;  // empty unless is_simple()
  bool has_attr(const std::string& name) const;
  // A string attribute, fixed or variable length (h5py's default), at most
  // max_len bytes, control characters blanked.
  std::string read_text_attr(const std::string& name, std::size_t max_len) const;
  // All of its elements, converted to `as`, into dst (numel elements).
  void read(ReadAs as, void* dst) const;

 private:
  friend class TensorGroup;
  struct Impl;
  explicit StoredDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A group of a TensorFile (its root or below). Move-only; closed when destroyed.
class TensorGroup {
 public:
  TensorGroup(TensorGroup&&) noexcept;
  TensorGroup& operator=(TensorGroup&&) noexcept;
  ~TensorGroup();

  const std::string& path() const;  // "file.h5:/calls/0"

  // ---- writing
  TensorGroup create_group(const std::string& name);
  void write_attr(const std::string& name, std::int64_t v);
  void write_attr(const std::string& name, int v) { write_attr(name, static_cast<std::int64_t>(v)); }
  void write_attr(const std::string& name, double v);
  void write_attr(const std::string& name, const std::string& v);  // fixed-length UTF-8
  void write_attr(const std::string& name, const char* v) { write_attr(name, std::string(v)); }
  // A dataset of `dtype` elements of this shape (golden's layout: dtype and
  // hash attributes, compact when small, else chunked with shuffle + gzip).
  void write_tensor(const std::string& name, DType dtype, const Shape& shape, const void* data);

  // ---- reading
  TensorGroup open_group(const std::string& name) const;  // hard links only
  bool has_attr(const std::string& name) const;
  std::string read_text_attr(const std::string& name, std::size_t max_len) const;  // as StoredDataset's
  bool has_link(const std::string& name) const;  // exists, and only as a hard link
  // Child names in name order; more than max_names throws.
  std::vector<std::string> list_names(std::size_t max_names) const;
  StoredDataset open_dataset(const std::string& name) const;

 private:
  friend class TensorFile;
  struct Impl;
  explicit TensorGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// An HDF5 file of tensors. Move-only; closed when destroyed (errors ignored
// there: call close() to have a failed flush thrown).
class TensorFile {
 public:
  static TensorFile create(const std::string& path);     // fails if it exists
  static TensorFile open_read(const std::string& path);  // read-only
  TensorFile(TensorFile&&) noexcept;
  TensorFile& operator=(TensorFile&&) noexcept;
  ~TensorFile();

  TensorGroup root() const;
  void close();

 private:
  struct Impl;
  explicit TensorFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlagate::golden
