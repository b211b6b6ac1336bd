// Private to golden/*.cpp: a thin RAII layer over the HDF5 C API (HighFive's
// design). Move-only handles templated on their close function, one checked
// wrapper per C function, failures thrown as H5Error with the HDF5 error stack.
// hdf5.h stops here: no public header includes this file.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mlagate::golden::h5 {

// Once per process: HDF5's own error printing off (errors become exceptions),
// filter plugins off (a file can only name the built-in filters).
void init();

// Throws H5Error: "`function` failed (`what`): <innermost HDF5 message>", the
// whole stack attached; the HDF5 error stack is cleared.
[[noreturn]] void fail(const char* function, const std::string& what);

template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;  // a copied hid_t would be closed twice
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  // Close now, ignoring errors (destructors and error paths).
  void reset() {
    if (id_ >= 0) Close(id_);
    id_ = H5I_INVALID_HID;
  }
  // Close now and report a failure (a file's close flushes its data).
  void close(const char* function, const std::string& what) {
    const hid_t id = std::exchange(id_, H5I_INVALID_HID);
    if (id >= 0 && Close(id) < 0) fail(function, what);
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Attribute = Handle<H5Aclose>;
using Dataspace = Handle<H5Sclose>;
using Datatype = Handle<H5Tclose>;
using PropList = Handle<H5Pclose>;

// Checked calls, one per C function; `what` names the object for messages.
PropList pcreate(hid_t cls, const std::string& what);                                      // H5Pcreate
void set_libver_bounds(const PropList& fapl, H5F_libver_t low, H5F_libver_t high);        // H5Pset_libver_bounds
void set_fclose_degree(const PropList& fapl, H5F_close_degree_t degree);                  // H5Pset_fclose_degree
void set_chunk(const PropList& dcpl, const std::vector<hsize_t>& dims);                   // H5Pset_chunk
void set_layout(const PropList& dcpl, H5D_layout_t layout);                               // H5Pset_layout
void set_shuffle(const PropList& dcpl);                                                   // H5Pset_shuffle
void set_deflate(const PropList& dcpl, unsigned level);                                   // H5Pset_deflate
void set_fletcher32(const PropList& dcpl);                                                // H5Pset_fletcher32
void set_fill_time(const PropList& dcpl, H5D_fill_time_t when);                           // H5Pset_fill_time
void set_attr_phase_change(const PropList& ocpl, unsigned max_compact, unsigned min_dense);  // H5Pset_attr_phase_change
H5D_layout_t get_layout(const PropList& dcpl, const std::string& what);                   // H5Pget_layout
int get_chunk(const PropList& dcpl, std::vector<hsize_t>& dims, const std::string& what); // H5Pget_chunk
int get_external_count(const PropList& dcpl, const std::string& what);                    // H5Pget_external_count
int get_nfilters(const PropList& dcpl, const std::string& what);                          // H5Pget_nfilters
H5Z_filter_t get_filter(const PropList& dcpl, unsigned idx, const std::string& what);     // H5Pget_filter2

File fcreate(const std::string& path, const PropList& fapl);  // H5Fcreate (H5F_ACC_EXCL)
File fopen(const std::string& path, unsigned flags, const PropList& fapl);  // H5Fopen
void fflush(const File& f, const std::string& what);         // H5Fflush
bool is_hdf5(const std::string& path);                       // H5Fis_hdf5 (false on any error)

Group gcreate(hid_t loc, const std::string& name, const std::string& what);  // H5Gcreate2
Group gopen(hid_t loc, const std::string& name, const std::string& what);    // H5Gopen2
bool lexists(hid_t loc, const std::string& name, const std::string& what);   // H5Lexists
void ocopy(hid_t src, const std::string& src_name, hid_t dst, const std::string& dst_name,
           const std::string& what);                                         // H5Ocopy
H5L_type_t link_type(hid_t loc, const std::string& name, const std::string& what);  // H5Lget_info
// Whether a (hard-linked) member is a group: H5Oopen + H5Iget_type, stable across HDF5 versions.
bool is_group(hid_t loc, const std::string& name, const std::string& what);
// Child link names in name order (H5Literate); more than max_names fails.
std::vector<std::string> list_links(hid_t loc, const std::string& what, std::size_t max_names);
// Attribute names of an object in name order (H5Aiterate2); more than max_names fails.
std::vector<std::string> list_attrs(hid_t loc, const std::string& what, std::size_t max_names);
// Copies attribute `name` of src onto dst with its stored type and shape
// (fixed-size types only: a variable-length one is refused).
void copy_attr(hid_t src, hid_t dst, const std::string& name, const std::string& what);

Dataspace screate_simple(const std::vector<hsize_t>& dims, const std::string& what);  // H5Screate_simple
Dataspace screate_scalar(const std::string& what);                                    // H5Screate
H5S_class_t sget_class(const Dataspace& s, const std::string& what);                  // H5Sget_simple_extent_type
std::vector<hsize_t> sget_dims(const Dataspace& s, const std::string& what);          // H5Sget_simple_extent_dims

Datatype tcopy(hid_t type, const std::string& what);                     // H5Tcopy
void tset_size(const Datatype& t, std::size_t size, const std::string& what);  // H5Tset_size
void tset_strpad(const Datatype& t, H5T_str_t pad, const std::string& what);   // H5Tset_strpad
void tset_cset(const Datatype& t, H5T_cset_t cset, const std::string& what);    // H5Tset_cset
H5T_class_t tget_class(const Datatype& t, const std::string& what);      // H5Tget_class
std::size_t tget_size(const Datatype& t, const std::string& what);       // H5Tget_size
H5T_sign_t tget_sign(const Datatype& t, const std::string& what);        // H5Tget_sign
bool tis_variable_str(const Datatype& t, const std::string& what);       // H5Tis_variable_str
H5T_str_t tget_strpad(const Datatype& t, const std::string& what);       // H5Tget_strpad

Dataset dcreate(hid_t loc, const std::string& name, hid_t type, const Dataspace& space, const PropList& dcpl,
                const std::string& what);                                              // H5Dcreate2
Dataset dopen(hid_t loc, const std::string& name, const std::string& what);           // H5Dopen2
Dataspace dget_space(const Dataset& d, const std::string& what);                       // H5Dget_space
Datatype dget_type(const Dataset& d, const std::string& what);                         // H5Dget_type
PropList dget_create_plist(const Dataset& d, const std::string& what);                 // H5Dget_create_plist
void dwrite(const Dataset& d, hid_t mem_type, const void* buf, const std::string& what);  // H5Dwrite
void dread(const Dataset& d, hid_t mem_type, void* buf, const std::string& what);         // H5Dread

Attribute acreate(hid_t loc, const std::string& name, hid_t type, const Dataspace& space,
                  const std::string& what);                                   // H5Acreate2
Attribute aopen(hid_t loc, const std::string& name, const std::string& what);  // H5Aopen
bool aexists(hid_t loc, const std::string& name, const std::string& what);     // H5Aexists
void adelete(hid_t loc, const std::string& name, const std::string& what);     // H5Adelete
Dataspace aget_space(const Attribute& a, const std::string& what);             // H5Aget_space
Datatype aget_type(const Attribute& a, const std::string& what);               // H5Aget_type
void awrite(const Attribute& a, hid_t mem_type, const void* buf, const std::string& what);  // H5Awrite
void aread(const Attribute& a, hid_t mem_type, void* buf, const std::string& what);         // H5Aread

}  // namespace mlagate::golden::h5
