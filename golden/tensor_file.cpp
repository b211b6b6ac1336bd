// golden/tensor_file.h over golden/detail: the RAII handles of h5.h and the
// typed attributes and datasets of io.h, so that files written through it are
// laid out as golden files are.
#include "golden/tensor_file.h"

#include <cstring>
#include <stdexcept>
#include <utility>

#include "golden/detail/h5.h"
#include "golden/detail/io.h"

namespace mlagate::golden {

namespace {

// A string attribute written by any HDF5 library: fixed length (as golden/
// writes them) or variable length (h5py's default for str).
std::string read_text_attr_at(hid_t loc, const std::string& name, const io::Where& w, std::size_t max_len) {
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

StoredType::Class class_of(H5T_class_t cls) {
  switch (cls) {
    case H5T_INTEGER: return StoredType::Class::kInteger;
    case H5T_FLOAT: return StoredType::Class::kFloat;
    case H5T_STRING: return StoredType::Class::kString;
    default: return StoredType::Class::kOther;
  }
}

}  // namespace

// ---- StoredDataset

struct StoredDataset::Impl {
  h5::Dataset ds;
  io::Where where;
  std::string path;
  StoredType type;
  bool simple = false;
  std::vector<std::uint64_t> dims;
};

StoredDataset::StoredDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoredDataset::StoredDataset(StoredDataset&&) noexcept = default;
StoredDataset& StoredDataset::operator=(StoredDataset&&) noexcept = default;
StoredDataset::~StoredDataset() = default;

const std::string& StoredDataset::path() const { return impl_->path; }
const StoredType& StoredDataset::type() const { return impl_->type; }
bool StoredDataset::is_simple() const { return impl_->simple; }
const std::vector<std::uint64_t>& StoredDataset::dims() const { return impl_->dims; }
bool StoredDataset::has_attr(const std::string& name) const { return io::has_attr(impl_->ds.get(), name, impl_->where); }
std::string StoredDataset::read_text_attr(const std::string& name, std::size_t max_len) const {
  return read_text_attr_at(impl_->ds.get(), name, impl_->where, max_len);
}
void StoredDataset::read(ReadAs as, void* dst) const {
  const hid_t mem = as == ReadAs::kU8 ? H5T_NATIVE_UINT8 : as == ReadAs::kU16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;
  h5::dread(impl_->ds, mem, dst, impl_->path);
}

// ---- TensorGroup

// `loc` is the group's own handle, or the file's for the root (attributes on
// a file id land on its root group, as golden's writer puts them).
struct TensorGroup::Impl {
  h5::Group owned;
  hid_t loc = H5I_INVALID_HID;
  io::Where where;
  std::string path;
  Impl(h5::Group g, hid_t l, io::Where w) : owned(std::move(g)), loc(l), where(std::move(w)), path(where.str()) {}
};

TensorGroup::TensorGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TensorGroup::TensorGroup(TensorGroup&&) noexcept = default;
TensorGroup& TensorGroup::operator=(TensorGroup&&) noexcept = default;
TensorGroup::~TensorGroup() = default;

const std::string& TensorGroup::path() const { return impl_->path; }

TensorGroup TensorGroup::create_group(const std::string& name) {
  h5::Group g = io::create_group(impl_->loc, name, impl_->where);
  const hid_t id = g.get();
  return TensorGroup(std::make_unique<Impl>(std::move(g), id, impl_->where / name));
}
void TensorGroup::write_attr(const std::string& name, std::int64_t v) { io::write_attr(impl_->loc, name, v, impl_->where); }
void TensorGroup::write_attr(const std::string& name, double v) { io::write_attr(impl_->loc, name, v, impl_->where); }
void TensorGroup::write_attr(const std::string& name, const std::string& v) {
  io::write_attr(impl_->loc, name, v, impl_->where);
}
void TensorGroup::write_tensor(const std::string& name, DType dtype, const Shape& shape, const void* data) {
  io::write_dataset(impl_->loc, name, dtype, shape, data, impl_->where);
}

TensorGroup TensorGroup::open_group(const std::string& name) const {
  h5::Group g = io::open_group(impl_->loc, name, impl_->where);
  const hid_t id = g.get();
  return TensorGroup(std::make_unique<Impl>(std::move(g), id, impl_->where / name));
}
bool TensorGroup::has_attr(const std::string& name) const { return io::has_attr(impl_->loc, name, impl_->where); }
std::string TensorGroup::read_text_attr(const std::string& name, std::size_t max_len) const {
  return read_text_attr_at(impl_->loc, name, impl_->where, max_len);
}
bool TensorGroup::has_link(const std::string& name) const { return io::has_link(impl_->loc, name, impl_->where); }
std::vector<std::string> TensorGroup::list_names(std::size_t max_names) const {
  return h5::list_links(impl_->loc, impl_->path, max_names);
}

StoredDataset TensorGroup::open_dataset(const std::string& name) const {
  auto d = std::make_unique<StoredDataset::Impl>();
  d->where = impl_->where / name;
  d->path = d->where.str();
  const std::string& what = d->path;
  d->ds = h5::dopen(impl_->loc, name, what);
  const h5::Datatype t = h5::dget_type(d->ds, what);
  const H5T_class_t cls = h5::tget_class(t, what);
  d->type.cls = class_of(cls);
  d->type.size = h5::tget_size(t, what);
  d->type.is_unsigned = cls == H5T_INTEGER && h5::tget_sign(t, what) == H5T_SGN_NONE;
  const h5::Dataspace space = h5::dget_space(d->ds, what);
  d->simple = h5::sget_class(space, what) == H5S_SIMPLE;
  if (d->simple)
    for (const hsize_t n : h5::sget_dims(space, what)) d->dims.push_back(static_cast<std::uint64_t>(n));
  return StoredDataset(std::move(d));
}

// ---- TensorFile

struct TensorFile::Impl {
  h5::File f;
  std::string path;
};

TensorFile::TensorFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TensorFile::TensorFile(TensorFile&&) noexcept = default;
TensorFile& TensorFile::operator=(TensorFile&&) noexcept = default;
TensorFile::~TensorFile() = default;

TensorFile TensorFile::create(const std::string& path) {
  h5::init();
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "file access properties");
  return TensorFile(std::make_unique<Impl>(Impl{h5::fcreate(path, fapl), path}));
}

TensorFile TensorFile::open_read(const std::string& path) {
  h5::init();
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "file access properties");
  return TensorFile(std::make_unique<Impl>(Impl{h5::fopen(path, H5F_ACC_RDONLY, fapl), path}));
}

TensorGroup TensorFile::root() const {
  return TensorGroup(std::make_unique<TensorGroup::Impl>(h5::Group(), impl_->f.get(), io::Where{impl_->path, "/"}));
}

void TensorFile::close() { impl_->f.close("H5Fclose", impl_->path); }

}  // namespace mlagate::golden
