// Helpers of golden_test_util.h. The edits go through golden's own RAII layer
// (golden/detail/h5.h): tests may use the private header, public code may not.
#include "tests/golden/golden_test_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <fstream>
#include <regex>
#include <sstream>

#include "cases/suite.h"
#include "golden/detail/h5.h"
#include "golden/detail/io.h"
#include "tests/cli_call.h"

extern char** environ;

namespace mlagate::testing {

namespace h5 = golden::h5;
namespace io = golden::io;

ScratchDir::ScratchDir() {
  std::string tmpl = (fs::path(::testing::TempDir()) / "mlagate_golden_XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}
ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}
std::vector<std::string> ScratchDir::entries() const {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<CaseSpec> small_specs() {
  const std::regex keep("small_decode|mixed_small/tp16|edge_padding");
  std::vector<CaseSpec> out;
  for (const CaseSpec& s : load_suite("smoke").cases)
    if (std::regex_search(s.id(), keep)) out.push_back(s);
  return out;
}

ExportOptions small_export_options() {
  ExportOptions opt;
  opt.ops = {Op::kLayer, Op::kDecode};
  opt.block_sizes = [](const CaseSpec&) { return std::vector<int>{16, 64}; };
  opt.command_line = "test";
  return opt;
}

void export_small(const fs::path& path, const std::vector<CaseSpec>& specs) {
  export_golden(specs, path.string(), small_export_options());
}

int cli(std::vector<std::string> args) { return test::cli(std::move(args)); }

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string case_path(const std::string& id) { return "/cases/" + id; }

namespace {

h5::File open_rw(const fs::path& file) {
  h5::init();
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "fapl");
  return h5::fopen(file.string(), H5F_ACC_RDWR, fapl);
}

// An object by path, as a generic HDF5 object handle.
using Object = h5::Handle<H5Oclose>;
Object open_object(const h5::File& f, const std::string& path) {
  const hid_t id = H5Oopen(f.get(), path.c_str(), H5P_DEFAULT);
  if (id < 0) h5::fail("H5Oopen", path);
  return Object(id);
}

void drop_attr(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) > 0 && H5Adelete(obj, name.c_str()) < 0) h5::fail("H5Adelete", name);
}

}  // namespace

void set_int_attr(const fs::path& file, const std::string& object, const std::string& name, std::int64_t v) {
  const h5::File f = open_rw(file);
  const Object o = open_object(f, object);
  drop_attr(o.get(), name);
  io::write_attr(o.get(), name, v, {file.string(), object});
}

void set_string_attr(const fs::path& file, const std::string& object, const std::string& name, const std::string& v) {
  const h5::File f = open_rw(file);
  const Object o = open_object(f, object);
  drop_attr(o.get(), name);
  io::write_attr(o.get(), name, v, {file.string(), object});
}

void set_vlen_string_attr(const fs::path& file, const std::string& object, const std::string& name,
                          const std::string& v) {
  const h5::File f = open_rw(file);
  const Object o = open_object(f, object);
  drop_attr(o.get(), name);
  const h5::Datatype t = h5::tcopy(H5T_C_S1, name);
  h5::tset_size(t, H5T_VARIABLE, name);
  const h5::Dataspace s = h5::screate_scalar(name);
  const h5::Attribute a = h5::acreate(o.get(), name, t.get(), s, name);
  const char* p = v.c_str();
  h5::awrite(a, t.get(), &p, name);
}

void delete_attr(const fs::path& file, const std::string& object, const std::string& name) {
  const h5::File f = open_rw(file);
  const Object o = open_object(f, object);
  drop_attr(o.get(), name);
}

void replace_dataset(const fs::path& file, const std::string& group, const std::string& name, const Tensor& t) {
  const h5::File f = open_rw(file);
  const h5::Group g = h5::gopen(f.get(), group, group);
  if (H5Ldelete(g.get(), name.c_str(), H5P_DEFAULT) < 0) h5::fail("H5Ldelete", name);
  io::write_tensor(g.get(), name, t, {file.string(), group});
}

void replace_with_external(const fs::path& file, const std::string& group, const std::string& name,
                           const std::string& raw_file, const Tensor& like) {
  const h5::File f = open_rw(file);
  const h5::Group g = h5::gopen(f.get(), group, group);
  if (H5Ldelete(g.get(), name.c_str(), H5P_DEFAULT) < 0) h5::fail("H5Ldelete", name);
  std::vector<hsize_t> dims(like.shape().begin(), like.shape().end());
  const h5::Dataspace s = h5::screate_simple(dims, name);
  const h5::PropList dcpl = h5::pcreate(H5P_DATASET_CREATE, name);
  if (H5Pset_external(dcpl.get(), raw_file.c_str(), 0, static_cast<hsize_t>(like.nbytes())) < 0)
    h5::fail("H5Pset_external", raw_file);
  const h5::Dataset d = h5::dcreate(g.get(), name, H5T_STD_U16LE, s, dcpl, name);
  io::write_attr(d.get(), "dtype", std::string(dtype_name(like.dtype())), {file.string(), group});
  io::write_attr(d.get(), "fnv1a64", hash_hex(fnv1a64(like.bytes(), like.nbytes())), {file.string(), group});
}

void make_soft_link(const fs::path& file, const std::string& group, const std::string& name) {
  const h5::File f = open_rw(file);
  const h5::Group g = h5::gopen(f.get(), group, group);
  const std::string moved = name + "_target";
  if (H5Lmove(g.get(), name.c_str(), g.get(), moved.c_str(), H5P_DEFAULT, H5P_DEFAULT) < 0) h5::fail("H5Lmove", name);
  if (H5Lcreate_soft(moved.c_str(), g.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT) < 0) h5::fail("H5Lcreate_soft", name);
}

namespace {
struct Extents {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> raw;  // offset, size
};
herr_t visit_link(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  if (info->type != H5L_TYPE_HARD) return 0;
  const Object o(H5Oopen(group, name, H5P_DEFAULT));
  if (!o || H5Iget_type(o.get()) != H5I_DATASET) return 0;
  const h5::Dataset d(H5Dopen2(group, name, H5P_DEFAULT));
  auto* ex = static_cast<Extents*>(data);
  const h5::PropList dcpl(H5Dget_create_plist(d.get()));
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t off = H5Dget_offset(d.get());
    if (off != HADDR_UNDEF) ex->raw.emplace_back(off, H5Dget_storage_size(d.get()));
  } else if (layout == H5D_CHUNKED) {
    hsize_t n = 0;
    H5Dget_num_chunks(d.get(), H5S_ALL, &n);
    for (hsize_t i = 0; i < n; ++i) {
      hsize_t coords[H5S_MAX_RANK];
      unsigned mask = 0;
      haddr_t addr = 0;
      hsize_t size = 0;
      if (H5Dget_chunk_info(d.get(), H5S_ALL, i, coords, &mask, &addr, &size) >= 0) ex->raw.emplace_back(addr, size);
    }
  }
  return 0;
}
}  // namespace

std::vector<std::pair<std::uint64_t, std::uint64_t>> metadata_ranges(const fs::path& file) {
  h5::init();
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "fapl");
  Extents ex;
  {
    const h5::File f = h5::fopen(file.string(), H5F_ACC_RDONLY, fapl);
    H5Lvisit(f.get(), H5_INDEX_NAME, H5_ITER_INC, visit_link, &ex);
  }
  std::sort(ex.raw.begin(), ex.raw.end());
  const std::uint64_t size = fs::file_size(file);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  std::uint64_t cur = 0;
  for (const auto& [off, n] : ex.raw) {
    if (off > cur) out.emplace_back(cur, off);
    cur = std::max(cur, off + n);
  }
  if (cur < size) out.emplace_back(cur, size);
  return out;
}

namespace {
// A filter that passes bytes through unchanged: registered under a foreign id
// so that a dataset can carry that id in its pipeline.
std::size_t pass_through(unsigned, std::size_t, const unsigned[], std::size_t nbytes, std::size_t*, void**) {
  return nbytes;
}
}  // namespace

void replace_dataset_filtered(const fs::path& file, const std::string& group, const std::string& name, const Tensor& t,
                              int filter) {
  const auto id = static_cast<H5Z_filter_t>(filter);
  if (H5Zfilter_avail(id) <= 0) {
    H5Z_class2_t cls{};
    cls.version = H5Z_CLASS_T_VERS;
    cls.id = id;
    cls.encoder_present = 1;
    cls.decoder_present = 1;
    cls.name = "mlagate test pass-through";
    cls.filter = pass_through;
    if (H5Zregister(&cls) < 0) h5::fail("H5Zregister", std::to_string(filter));
  }
  const h5::File f = open_rw(file);
  const h5::Group g = h5::gopen(f.get(), group, group);
  if (H5Ldelete(g.get(), name.c_str(), H5P_DEFAULT) < 0) h5::fail("H5Ldelete", name);
  const std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
  const h5::Dataspace sp = h5::screate_simple(dims, name);
  const h5::PropList dcpl = h5::pcreate(H5P_DATASET_CREATE, name);
  h5::set_chunk(dcpl, dims);
  if (H5Pset_filter(dcpl.get(), id, H5Z_FLAG_MANDATORY, 0, nullptr) < 0) h5::fail("H5Pset_filter", name);
  if (t.dtype() != DType::kF64) throw std::logic_error("replace_dataset_filtered: float64 datasets only");
  const h5::Dataset d = h5::dcreate(g.get(), name, H5T_IEEE_F64LE, sp, dcpl, name);
  h5::dwrite(d, H5T_NATIVE_DOUBLE, t.bytes(), name);
  const io::Where w{file.string(), group + "/" + name};
  io::write_attr(d.get(), "dtype", std::string(dtype_name(t.dtype())), w);
  io::write_attr(d.get(), "fnv1a64", hash_hex(fnv1a64(t.bytes(), t.nbytes())), w);
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> chunk_ranges(const fs::path& file, const std::string& dataset) {
  h5::init();
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "fapl");
  const h5::File f = h5::fopen(file.string(), H5F_ACC_RDONLY, fapl);
  const h5::Dataset d(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT));
  if (!d) h5::fail("H5Dopen2", dataset);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  hsize_t n = 0;
  const h5::Dataspace space = h5::dget_space(d, dataset);
  if (H5Dget_num_chunks(d.get(), space.get(), &n) < 0) h5::fail("H5Dget_num_chunks", dataset);
  for (hsize_t i = 0; i < n; ++i) {
    hsize_t coords[H5S_MAX_RANK];
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    if (H5Dget_chunk_info(d.get(), space.get(), i, coords, &mask, &addr, &size) < 0) h5::fail("H5Dget_chunk_info", dataset);
    out.emplace_back(addr, size);
  }
  return out;
}

void copy_group(const fs::path& file, const std::string& from, const std::string& to) {
  const h5::File f = open_rw(file);
  const h5::PropList lcpl = h5::pcreate(H5P_LINK_CREATE, to);
  if (H5Pset_create_intermediate_group(lcpl.get(), 1) < 0) h5::fail("H5Pset_create_intermediate_group", to);
  if (H5Ocopy(f.get(), from.c_str(), f.get(), to.c_str(), H5P_DEFAULT, lcpl.get()) < 0) h5::fail("H5Ocopy", from);
}

BinaryRun run_binary(const std::vector<std::string>& args, const fs::path& scratch) {
  const std::string out = (scratch / "binary.stdout").string(), err = (scratch / "binary.stderr").string();
  std::vector<std::string> all{MLAGATE_TEST_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int sp = posix_spawn(&pid, all[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  BinaryRun r;
  if (sp != 0) throw std::runtime_error("posix_spawn " + all[0] + " failed: " + std::to_string(sp));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

Tensor doubles(const std::vector<double>& v, const Shape& shape) {
  Tensor t(DType::kF64, shape);
  if (v.size() * sizeof(double) != t.nbytes()) throw std::invalid_argument("doubles: values and shape disagree");
  std::memcpy(t.bytes(), v.data(), t.nbytes());
  return t;
}

}  // namespace mlagate::testing
