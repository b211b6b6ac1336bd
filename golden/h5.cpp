// The checked HDF5 calls of detail/h5.h: each wraps one C function and turns a
// negative return into H5Error carrying the HDF5 error stack.
#include "golden/detail/h5.h"

#include <mutex>

#include "golden/golden_file.h"

namespace mlagate::golden::h5 {

namespace {

herr_t collect_error(unsigned, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  char major[160] = "", minor[160] = "";
  H5Eget_msg(e->maj_num, nullptr, major, sizeof major);
  H5Eget_msg(e->min_num, nullptr, minor, sizeof minor);
  std::string line = std::string(e->func_name ? e->func_name : "?") + "(): " + (e->desc ? e->desc : "");
  line += std::string(" [") + major + ": " + minor + "]";
  out->push_back(std::move(line));
  return 0;
}

template <class T>
T checked(T r, const char* fn, const std::string& what) {
  if (r < 0) fail(fn, what);
  return r;
}

}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    H5PLset_loading_state(0);
  });
}

void fail(const char* function, const std::string& what) {
  std::vector<std::string> stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &stack);
  H5Eclear2(H5E_DEFAULT);
  // The innermost entry says what went wrong in the file's own terms.
  std::string detail;
  if (!stack.empty()) {
    const std::string& last = stack.back();
    const auto colon = last.find("(): ");
    detail = colon == std::string::npos ? last : last.substr(colon + 4);
  }
  throw H5Error(std::string(function) + " failed (" + what + ")" + (detail.empty() ? "" : ": " + detail),
                std::move(stack));
}

PropList pcreate(hid_t cls, const std::string& what) { return PropList(checked(H5Pcreate(cls), "H5Pcreate", what)); }
void set_libver_bounds(const PropList& fapl, H5F_libver_t low, H5F_libver_t high) {
  checked(H5Pset_libver_bounds(fapl.get(), low, high), "H5Pset_libver_bounds", "file access properties");
}
void set_fclose_degree(const PropList& fapl, H5F_close_degree_t degree) {
  checked(H5Pset_fclose_degree(fapl.get(), degree), "H5Pset_fclose_degree", "file access properties");
}
void set_chunk(const PropList& dcpl, const std::vector<hsize_t>& dims) {
  checked(H5Pset_chunk(dcpl.get(), static_cast<int>(dims.size()), dims.data()), "H5Pset_chunk", "dataset properties");
}
void set_layout(const PropList& dcpl, H5D_layout_t layout) {
  checked(H5Pset_layout(dcpl.get(), layout), "H5Pset_layout", "dataset properties");
}
void set_shuffle(const PropList& dcpl) { checked(H5Pset_shuffle(dcpl.get()), "H5Pset_shuffle", "dataset properties"); }
void set_deflate(const PropList& dcpl, unsigned level) {
  checked(H5Pset_deflate(dcpl.get(), level), "H5Pset_deflate", "dataset properties");
}
void set_fletcher32(const PropList& dcpl) {
  checked(H5Pset_fletcher32(dcpl.get()), "H5Pset_fletcher32", "dataset properties");
}
void set_fill_time(const PropList& dcpl, H5D_fill_time_t when) {
  checked(H5Pset_fill_time(dcpl.get(), when), "H5Pset_fill_time", "dataset properties");
}
void set_attr_phase_change(const PropList& ocpl, unsigned max_compact, unsigned min_dense) {
  checked(H5Pset_attr_phase_change(ocpl.get(), max_compact, min_dense), "H5Pset_attr_phase_change", "object properties");
}
H5D_layout_t get_layout(const PropList& dcpl, const std::string& what) {
  const H5D_layout_t l = H5Pget_layout(dcpl.get());
  if (l < 0) fail("H5Pget_layout", what);
  return l;
}
int get_chunk(const PropList& dcpl, std::vector<hsize_t>& dims, const std::string& what) {
  dims.assign(H5S_MAX_RANK, 0);
  const int rank = checked(H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, dims.data()), "H5Pget_chunk", what);
  dims.resize(static_cast<std::size_t>(rank));
  return rank;
}
int get_external_count(const PropList& dcpl, const std::string& what) {
  return checked(H5Pget_external_count(dcpl.get()), "H5Pget_external_count", what);
}
int get_nfilters(const PropList& dcpl, const std::string& what) {
  return checked(H5Pget_nfilters(dcpl.get()), "H5Pget_nfilters", what);
}
H5Z_filter_t get_filter(const PropList& dcpl, unsigned idx, const std::string& what) {
  unsigned flags = 0, config = 0;
  std::size_t nelmts = 0;
  char name[64];
  const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), idx, &flags, &nelmts, nullptr, sizeof name, name, &config);
  if (f < 0) fail("H5Pget_filter2", what);
  return f;
}

File fcreate(const std::string& path, const PropList& fapl) {
  return File(checked(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), "H5Fcreate", path));
}
File fopen(const std::string& path, unsigned flags, const PropList& fapl) {
  return File(checked(H5Fopen(path.c_str(), flags, fapl.get()), "H5Fopen", path));
}
void fflush(const File& f, const std::string& what) {
  checked(H5Fflush(f.get(), H5F_SCOPE_GLOBAL), "H5Fflush", what);
}
bool is_hdf5(const std::string& path) {
  const htri_t r = H5Fis_hdf5(path.c_str());
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

Group gcreate(hid_t loc, const std::string& name, const std::string& what) {
  return Group(checked(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "H5Gcreate2", what));
}
Group gopen(hid_t loc, const std::string& name, const std::string& what) {
  return Group(checked(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), "H5Gopen2", what));
}
void ocopy(hid_t src, const std::string& src_name, hid_t dst, const std::string& dst_name, const std::string& what) {
  checked(H5Ocopy(src, src_name.c_str(), dst, dst_name.c_str(), H5P_DEFAULT, H5P_DEFAULT), "H5Ocopy", what);
}
bool lexists(hid_t loc, const std::string& name, const std::string& what) {
  return checked(H5Lexists(loc, name.c_str(), H5P_DEFAULT), "H5Lexists", what) > 0;
}
H5L_type_t link_type(hid_t loc, const std::string& name, const std::string& what) {
  H5L_info_t info{};
  checked(H5Lget_info(loc, name.c_str(), &info, H5P_DEFAULT), "H5Lget_info", what);
  return info.type;
}
bool is_group(hid_t loc, const std::string& name, const std::string& what) {
  const hid_t o = checked(H5Oopen(loc, name.c_str(), H5P_DEFAULT), "H5Oopen", what);
  const H5I_type_t t = H5Iget_type(o);
  H5Oclose(o);
  return t == H5I_GROUP;
}

namespace {
struct ListState {
  std::vector<std::string> names;
  std::size_t max_names;
  bool overflow = false;
};
// The H5Literate and H5Aiterate2 callback alike (they differ in the info type).
template <class Info>
herr_t list_one(hid_t, const char* name, const Info*, void* data) {
  auto* st = static_cast<ListState*>(data);
  if (st->names.size() >= st->max_names) {
    st->overflow = true;
    return 1;  // stop
  }
  st->names.emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_links(hid_t loc, const std::string& what, std::size_t max_names) {
  ListState st{{}, max_names};
  hsize_t idx = 0;
  checked(H5Literate(loc, H5_INDEX_NAME, H5_ITER_INC, &idx, list_one<H5L_info_t>, &st), "H5Literate", what);
  if (st.overflow) throw GoldenFileError(what + ": more than " + std::to_string(max_names) + " members");
  return st.names;
}

std::vector<std::string> list_attrs(hid_t loc, const std::string& what, std::size_t max_names) {
  ListState st{{}, max_names};
  hsize_t idx = 0;
  checked(H5Aiterate2(loc, H5_INDEX_NAME, H5_ITER_INC, &idx, list_one<H5A_info_t>, &st), "H5Aiterate2", what);
  if (st.overflow) throw GoldenFileError(what + ": more than " + std::to_string(max_names) + " attributes");
  return st.names;
}

void copy_attr(hid_t src, hid_t dst, const std::string& name, const std::string& what) {
  const Attribute a = aopen(src, name, what);
  const Datatype t = aget_type(a, what);
  if (H5Tdetect_class(t.get(), H5T_VLEN) != 0 || tis_variable_str(t, what))
    throw GoldenFileError(what + ": attribute " + name + " has a variable-length type");
  const Dataspace space = aget_space(a, what);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0) fail("H5Sget_simple_extent_npoints", what);
  std::vector<unsigned char> buf(static_cast<std::size_t>(n) * tget_size(t, what));
  aread(a, t.get(), buf.data(), what);
  const Attribute out = acreate(dst, name, t.get(), space, what);
  awrite(out, t.get(), buf.data(), what);
}

Dataspace screate_simple(const std::vector<hsize_t>& dims, const std::string& what) {
  return Dataspace(checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple", what));
}
Dataspace screate_scalar(const std::string& what) { return Dataspace(checked(H5Screate(H5S_SCALAR), "H5Screate", what)); }
H5S_class_t sget_class(const Dataspace& s, const std::string& what) {
  const H5S_class_t c = H5Sget_simple_extent_type(s.get());
  if (c == H5S_NO_CLASS) fail("H5Sget_simple_extent_type", what);
  return c;
}
std::vector<hsize_t> sget_dims(const Dataspace& s, const std::string& what) {
  const int rank = checked(H5Sget_simple_extent_ndims(s.get()), "H5Sget_simple_extent_ndims", what);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) checked(H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims", what);
  return dims;
}

Datatype tcopy(hid_t type, const std::string& what) { return Datatype(checked(H5Tcopy(type), "H5Tcopy", what)); }
void tset_size(const Datatype& t, std::size_t size, const std::string& what) {
  checked(H5Tset_size(t.get(), size), "H5Tset_size", what);
}
void tset_strpad(const Datatype& t, H5T_str_t pad, const std::string& what) {
  checked(H5Tset_strpad(t.get(), pad), "H5Tset_strpad", what);
}
void tset_cset(const Datatype& t, H5T_cset_t cset, const std::string& what) {
  checked(H5Tset_cset(t.get(), cset), "H5Tset_cset", what);
}
H5T_class_t tget_class(const Datatype& t, const std::string& what) {
  const H5T_class_t c = H5Tget_class(t.get());
  if (c == H5T_NO_CLASS) fail("H5Tget_class", what);
  return c;
}
std::size_t tget_size(const Datatype& t, const std::string& what) {
  const std::size_t s = H5Tget_size(t.get());
  if (s == 0) fail("H5Tget_size", what);
  return s;
}
H5T_sign_t tget_sign(const Datatype& t, const std::string& what) {
  const H5T_sign_t s = H5Tget_sign(t.get());
  if (s == H5T_SGN_ERROR) fail("H5Tget_sign", what);
  return s;
}
bool tis_variable_str(const Datatype& t, const std::string& what) {
  return checked(H5Tis_variable_str(t.get()), "H5Tis_variable_str", what) > 0;
}
H5T_str_t tget_strpad(const Datatype& t, const std::string& what) {
  const H5T_str_t p = H5Tget_strpad(t.get());
  if (p == H5T_STR_ERROR) fail("H5Tget_strpad", what);
  return p;
}

Dataset dcreate(hid_t loc, const std::string& name, hid_t type, const Dataspace& space, const PropList& dcpl,
                const std::string& what) {
  return Dataset(checked(H5Dcreate2(loc, name.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                         "H5Dcreate2", what));
}
Dataset dopen(hid_t loc, const std::string& name, const std::string& what) {
  return Dataset(checked(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), "H5Dopen2", what));
}
Dataspace dget_space(const Dataset& d, const std::string& what) {
  return Dataspace(checked(H5Dget_space(d.get()), "H5Dget_space", what));
}
Datatype dget_type(const Dataset& d, const std::string& what) {
  return Datatype(checked(H5Dget_type(d.get()), "H5Dget_type", what));
}
PropList dget_create_plist(const Dataset& d, const std::string& what) {
  return PropList(checked(H5Dget_create_plist(d.get()), "H5Dget_create_plist", what));
}
void dwrite(const Dataset& d, hid_t mem_type, const void* buf, const std::string& what) {
  checked(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), "H5Dwrite", what);
}
void dread(const Dataset& d, hid_t mem_type, void* buf, const std::string& what) {
  checked(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), "H5Dread", what);
}

Attribute acreate(hid_t loc, const std::string& name, hid_t type, const Dataspace& space, const std::string& what) {
  return Attribute(checked(H5Acreate2(loc, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), "H5Acreate2", what));
}
Attribute aopen(hid_t loc, const std::string& name, const std::string& what) {
  return Attribute(checked(H5Aopen(loc, name.c_str(), H5P_DEFAULT), "H5Aopen", what));
}
bool aexists(hid_t loc, const std::string& name, const std::string& what) {
  return checked(H5Aexists(loc, name.c_str()), "H5Aexists", what) > 0;
}
void adelete(hid_t loc, const std::string& name, const std::string& what) {
  checked(H5Adelete(loc, name.c_str()), "H5Adelete", what);
}
Dataspace aget_space(const Attribute& a, const std::string& what) {
  return Dataspace(checked(H5Aget_space(a.get()), "H5Aget_space", what));
}
Datatype aget_type(const Attribute& a, const std::string& what) {
  return Datatype(checked(H5Aget_type(a.get()), "H5Aget_type", what));
}
void awrite(const Attribute& a, hid_t mem_type, const void* buf, const std::string& what) {
  checked(H5Awrite(a.get(), mem_type, buf), "H5Awrite", what);
}
void aread(const Attribute& a, hid_t mem_type, void* buf, const std::string& what) {
  checked(H5Aread(a.get(), mem_type, buf), "H5Aread", what);
}

}  // namespace mlagate::golden::h5
