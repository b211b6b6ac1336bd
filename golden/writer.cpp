// Writing schema v1: the temporary file renamed into place, case groups
// (spec attributes, inputs, caches, references), results files and export.
#include "golden/detail/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>

#include "cases/generator.h"
#include "golden/detail/schema.h"
#include "golden/detail/sparse_io.h"
#include "golden/detail/merge_states_io.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"
#include "reference/sparse_reference.h"
#include "mlagate/version.h"
#include "reference/fp64_reference.h"

namespace mlagate {

namespace golden {

namespace fs = std::filesystem;

namespace {

// References: stored without gzip (io::write_dataset says why).
constexpr io::Compress kRef = io::Compress::kNone;

void write_provenance(hid_t g, const io::Where& w) {
  io::write_attr(g, "schema", kGoldenSchema, w);
  io::write_attr(g, "schema_version", kGoldenSchemaVersion, w);
  io::write_attr(g, "generator_version", gen::kGeneratorVersion, w);
  io::write_attr(g, "mlagate_version", MLAGATE_VERSION, w);
  io::write_attr(g, "git_commit", MLAGATE_GIT_COMMIT, w);
}

// "fixed(atol=0.05, rtol=0.01)" -> "fixed": whatever kinds Policy grows.
std::string policy_name(const Policy& p) {
  const std::string d = p.describe();
  return d.substr(0, d.find('('));
}

// Messages are one line; an attribute lives in a 64 KiB object header message.
std::string clip(const std::string& s) { return s.size() > 16384 ? s.substr(0, 16384) + "..." : s; }

Tensor i32_tensor(const std::vector<std::int32_t>& v) {
  Tensor t(DType::kI32, {static_cast<std::int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.bytes(), v.data(), t.nbytes());
  return t;
}

}  // namespace

TempH5::TempH5(const std::string& target, FileKind kind, const std::string& command_line) : target_(target) {
  const fs::path tp(target);
  const fs::path dir = tp.has_parent_path() ? tp.parent_path() : fs::path(".");
  if (!fs::is_directory(dir)) throw GoldenFileError("output " + target + ": no directory " + dir.string());
  if (fs::is_directory(tp)) throw GoldenFileError("output " + target + " is a directory");
  h5::init();
  // A dot name beside the target (same file system, so rename is atomic); the
  // pid and a counter keep concurrent writers apart, H5F_ACC_EXCL the rest.
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100 && temp_.empty(); ++attempt) {
    std::string name = ".";
    name += tp.filename().string();
    name += ".tmp.";
    name += std::to_string(::getpid());
    name += '.';
    name += std::to_string(counter++);
    const fs::path p = dir / name;
    if (!fs::exists(p)) temp_ = p.string();
  }
  if (temp_.empty()) throw GoldenFileError("output " + target + ": too many leftover temporary files");
  where_ = {target, "/"};
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "file access properties");
  // The newest format: checksums on every piece of metadata, so a corrupt file
  // fails to open instead of being misread (readable by HDF5 >= 1.10).
  h5::set_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  try {
    file_ = h5::fcreate(temp_, fapl);
    const hid_t root = file_.get();
    write_provenance(root, where_);
    io::write_attr(root, "file_kind", schema::file_kind_name(kind), where_);
    io::write_attr(root, "created_at", iso_now(), where_);
    io::write_attr(root, "command_line", clip(command_line), where_);
  } catch (...) {
    file_.reset();
    std::remove(temp_.c_str());
    throw;
  }
}

TempH5::~TempH5() {
  if (committed_) return;
  open_.clear();
  file_.reset();
  std::remove(temp_.c_str());
}

hid_t TempH5::group(const std::string& path, bool& created) {
  created = false;
  std::size_t pos = 0;
  hid_t parent = file_.get();
  while (true) {
    const std::size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    auto it = open_.find(prefix);
    if (it == open_.end()) {
      const std::string name = path.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
      std::string parent_path = "/";
      parent_path += path.substr(0, pos == 0 ? 0 : pos - 1);
      const io::Where parent_where{target_, parent_path};
      it = open_.emplace(prefix, io::create_group(parent, name, parent_where)).first;
      created = slash == std::string::npos;
    }
    parent = it->second.get();
    if (slash == std::string::npos) return parent;
    pos = slash + 1;
  }
}

hid_t TempH5::case_group(const std::string& id, bool& created) {
  schema::id_path(id);  // throws for an id that cannot be a path
  bool made = false;
  const hid_t g = group(std::string(schema::kCasesGroup) + "/" + id, made);
  created = id_set_.insert(id).second;
  if (created) ids_.push_back(id);
  return g;
}

void TempH5::copy_case(hid_t src, const std::string& id, const std::vector<std::string>& nested) {
  schema::id_path(id);
  const std::string path = std::string(schema::kCasesGroup) + "/" + id;
  const std::string what = target_ + ":/" + path;
  if (id_set_.count(id)) throw GoldenFileError(target_ + ": case " + id + " copied twice");
  // Through group(): the case group may already be there as the parent of a
  // nested case copied before it.
  bool created = false;
  const hid_t dst = group(path, created);
  const h5::Group from = h5::gopen(src, path, what);
  constexpr std::size_t kMaxMembers = 1 << 16;
  for (const std::string& name : h5::list_attrs(from.get(), what, kMaxMembers)) {
    if (h5::aexists(dst, name, what)) throw GoldenFileError(what + ": attribute " + name + " is there twice");
    h5::copy_attr(from.get(), dst, name, what);
  }
  for (const std::string& name : h5::list_links(from.get(), what, kMaxMembers)) {
    if (std::find(nested.begin(), nested.end(), name) != nested.end()) continue;
    if (h5::lexists(dst, name, what))
      throw GoldenFileError(what + ": member " + name + " is also the path of another case");
    h5::ocopy(from.get(), name, dst, name, what + "/" + name);
  }
  id_set_.insert(id);
  ids_.push_back(id);
}

void TempH5::commit() {
  io::write_strings(file_.get(), schema::kCaseIds, ids_, where_);
  io::write_attr(file_.get(), "num_cases", static_cast<std::int64_t>(ids_.size()), where_);
  for (auto it = open_.rbegin(); it != open_.rend(); ++it) it->second.close("H5Gclose", target_ + ":/" + it->first);
  open_.clear();
  file_.close("H5Fclose", temp_);
  // Durable contents before the rename: after a crash the target is old or new, never partial.
  const int fd = ::open(temp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw GoldenFileError("cannot flush " + temp_ + ": " + std::strerror(err));
  }
  ::close(fd);
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    throw GoldenFileError("cannot rename " + temp_ + " onto " + target_ + ": " + std::strerror(errno));
  committed_ = true;
}

void write_case_header(hid_t g, const CaseSpec& spec, const InputHashes* hashes, const Policy& policy,
                       const io::Where& w) {
  write_provenance(g, w);
  io::write_attr(g, "case_id", spec.id(), w);
  io::write_attr(g, "valid", 1, w);
  io::write_attr(g, "suite", spec.suite, w);
  io::write_attr(g, "batch_name", spec.batch.name, w);
  io::write_attr(g, "batch_note", clip(spec.batch.note), w);
  io::write_attr(g, "spec_decode", spec.batch.spec_decode ? 1 : 0, w);
  io::write_attr(g, "total_heads", spec.total_heads, w);
  io::write_attr(g, "tp", spec.tp, w);
  io::write_attr(g, "num_heads", spec.num_heads(), w);
  io::write_attr(g, "dtype", std::string(dtype_name(spec.dtype)), w);
  io::write_attr(g, "kv_cache_dtype", kv_cache_format_name(spec.kv_format()), w);  // "fp8_ds_mla:raw" carries the scale rule
  io::write_attr(g, "block_size", spec.block_size, w);
  io::write_attr_u64(g, "seed", spec.seed, w);
  io::write_attr(g, "q_magnitude", spec.q_magnitude, w);
  io::write_attr(g, "scale", spec.softmax_scale(), w);
  io::write_attr(g, "scale_is_default", spec.scale ? 0 : 1, w);
  io::write_attr(g, "k_scale", static_cast<double>(spec.k_scale), w);
  // Only where set (triage's what-if): files of ordinary cases keep their attributes.
  if (spec.reference_k_scale_rounded) io::write_attr(g, "reference_k_scale", std::string("model_dtype"), w);
  io::write_attr(g, "kv_lora_rank", spec.dims.kv_lora_rank, w);
  io::write_attr(g, "rope_dim", spec.dims.rope_dim, w);
  io::write_attr(g, "nope_dim", spec.dims.nope_dim, w);
  io::write_attr(g, "v_head_dim", spec.dims.v_head_dim, w);
  io::write_attr(g, "num_requests", spec.num_requests(), w);
  io::write_attr(g, "num_tokens", spec.num_tokens(), w);
  io::write_attr(g, "num_kv_tokens", spec.num_kv_tokens(), w);
  write_sparse_spec(g, spec.sparse, w);
  // Only where set (cases/LAYOUTS.md): files of contiguous cases keep their attributes.
  if (!spec.layout.contiguous()) io::write_attr(g, "layout", layout_name(spec.layout), w);
  // Only where set (a suite group's `ops`): run --golden then runs the case in
  // those ops alone, as the suite did; absent, in every op of the run.
  if (!spec.ops.empty()) io::write_attr(g, "ops", op_names(spec.ops), w);
  if (spec.merge.active()) {
    // A merge case (SCHEMA.md, "Merge cases").
    io::write_attr(g, "merge_head_dim", spec.merge.head_dim, w);
    io::write_attr(g, "merge_lse", std::string(lse_pattern_name(spec.merge.lse)), w);
    io::write_attr(g, "merge_lse_gap", spec.merge.gap, w);
  }
  io::write_attr(g, "policy", policy.describe(), w);
  io::write_attr(g, "policy_name", policy_name(policy), w);
  io::write_attr(g, "atol", policy.atol, w);
  io::write_attr(g, "rtol", policy.rtol, w);
  io::write_attr(g, "fudge", policy.fudge, w);
  if (hashes) {
    io::write_attr(g, "input_hash", hash_hex(hashes->combined), w);
    const std::uint64_t each[5] = {hashes->q, hashes->kv_c, hashes->k_pe, hashes->w_uk, hashes->w_uv};
    for (std::size_t i = 0; i < 5; ++i) io::write_attr(g, std::string("hash_") + schema::kInputNames[i], hash_hex(each[i]), w);
    if (hashes->has_xxh)
      for (std::size_t i = 0; i < 5; ++i)
        io::write_attr(g, std::string("xxh64_") + schema::kInputNames[i], hash_hex(hashes->xxh[i]), w);
  }
  std::vector<std::int32_t> seq(spec.batch.seq_lens.begin(), spec.batch.seq_lens.end());
  std::vector<std::int32_t> ql(spec.batch.query_lens.begin(), spec.batch.query_lens.end());
  std::vector<std::int32_t> qsl{0};
  for (auto q : ql) qsl.push_back(qsl.back() + q);
  io::write_tensor(g, "seq_lens", i32_tensor(seq), w);
  io::write_tensor(g, "query_lens", i32_tensor(ql), w);
  io::write_tensor(g, "query_start_loc", i32_tensor(qsl), w);
}

void write_case_content(hid_t g, const PreparedCase& pc, const io::Where& w) {
  const Case& c = pc.c;
  if (pc.merge) {  // SCHEMA.md, "Merge cases": the merge_states group alone
    write_merge_group(g, c, *pc.merge, w);
    return;
  }
  {
    const h5::Group in = io::create_group(g, schema::kInputsGroup, w);
    const io::Where wi = w / schema::kInputsGroup;
    const auto ts = schema::input_tensors(c);
    for (std::size_t i = 0; i < ts.size(); ++i) io::write_tensor(in.get(), schema::kInputNames[i], *ts[i], wi);
  }
  {
    const h5::Group cg = io::create_group(g, schema::kCacheGroup, w);
    const io::Where wc = w / schema::kCacheGroup;
    for (const auto& [bs, cache] : pc.caches) {
      const std::string name = schema::cache_group_name(bs);
      const h5::Group b = io::create_group(cg.get(), name, wc);
      const io::Where wb = wc / name;
      io::write_attr(b.get(), "block_size", cache.block_size, wb);
      io::write_attr(b.get(), "num_blocks", cache.num_blocks, wb);
      io::write_attr(b.get(), "used_blocks", cache.used_blocks, wb);
      io::write_attr(b.get(), "spare_blocks", cache.options.spare_blocks, wb);
      io::write_attr(b.get(), "entry_bytes", cache.entry_bytes, wb);
      io::write_attr(b.get(), "table_width", cache.table_width, wb);
      io::write_attr(b.get(), "kv_cache_dtype", std::string(kv_cache_dtype_name(cache.kv_dtype)), wb);
      io::write_attr(b.get(), "elem_dtype", std::string(dtype_name(cache.elem_dtype)), wb);
      // The entry format in full (cases/KV_CACHE.md): data is uint8, fp8 values float8_e4m3fn.
      io::write_attr(b.get(), "value_dtype", entry_value_dtype(cache.format()), wb);
      io::write_attr(b.get(), "entry_layout", entry_layout_string(cache.format()), wb);
      if (cache.kv_dtype == KvCacheDtype::kFp8DsMla)
        io::write_attr(b.get(), "scale_rule", std::string(scale_rule_name(cache.scale_rule)), wb);
      if (cache.kv_dtype == KvCacheDtype::kFp8 || cache.kv_dtype == KvCacheDtype::kFp8E4m3)
        io::write_attr(b.get(), "k_scale", static_cast<double>(cache.k_scale), wb);
      io::write_attr(b.get(), "poison", std::string(poison_name(cache.options.poison)), wb);
      io::write_attr(b.get(), "poison_block_table", cache.options.poison_block_table ? 1 : 0, wb);
      io::write_attr(b.get(), "new_tokens_written", cache.options.write_new_tokens ? 1 : 0, wb);
      // The pool's bytes; a strided layout's other layers are not stored (their pattern is fixed).
      io::write_dataset(b.get(), "data", cache.data.dtype(), cache.data.shape(), cache.data.bytes(), wb);
      io::write_tensor(b.get(), "block_table", cache.block_table, wb);
      io::write_tensor(b.get(), "slot_mapping", cache.slot_mapping, wb);
    }
  }
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads();
  const Dims& d = c.spec.dims;
  if (pc.reference) {
    const h5::Group gg = io::create_group(g, schema::kGoldenGroup, w);
    const io::Where wg = w / schema::kGoldenGroup;
    io::write_attr(gg.get(), "reference", "fp64, absorbed path (reference/fp64_reference.h reference_absorbed)", wg);
    io::write_dataset(gg.get(), "out", DType::kF64, {T, N * d.v_head_dim}, pc.reference->out.data(), wg, kRef);
    io::write_dataset(gg.get(), "lse", DType::kF64, {T, N}, pc.reference->lse.data(), wg, kRef);
  }
  if (pc.sparse) write_sparse_group(g, pc.c, *pc.sparse, w);
  if (pc.decode) {
    const h5::Group dg = io::create_group(g, schema::kDecodeGroup, w);
    const io::Where wd = w / schema::kDecodeGroup;
    io::write_attr(dg.get(), "reference", "fp64 on the absorbed queries (reference/fp64_reference.h reference_mqa)", wd);
    io::write_tensor(dg.get(), "q_lat", pc.decode->q_lat, wd);
    io::write_tensor(dg.get(), "q_pe", pc.decode->q_pe, wd);
    io::write_dataset(dg.get(), "o_lat", DType::kF64, {T, N, d.kv_lora_rank}, pc.decode->o_lat.data(), wd, kRef);
    io::write_dataset(dg.get(), "lse", DType::kF64, {T, N}, pc.decode->lse.data(), wd, kRef);
  }
  if (pc.baselines) {
    const StoredBaselines& b = *pc.baselines;
    const h5::Group bg = io::create_group(g, schema::kBaselineGroup, w);
    const io::Where wb = w / schema::kBaselineGroup;
    io::write_attr(bg.get(), "implementation", "emulated (reference/sdpa_emulation.h)", wb);
    if (!b.layer_out[0].empty()) {
      const std::int64_t B = c.num_requests;
      std::vector<double> out, lse;
      for (int f = 0; f < 2; ++f) {
        out.insert(out.end(), b.layer_out[f].begin(), b.layer_out[f].end());
        lse.insert(lse.end(), b.layer_lse[f].begin(), b.layer_lse[f].end());
      }
      io::write_dataset(bg.get(), "layer_out", DType::kF64, {2, B}, out.data(), wb);
      io::write_dataset(bg.get(), "layer_lse", DType::kF64, {2, B}, lse.data(), wb);
    }
    const std::pair<const char*, const std::optional<std::array<double, 2>>*> ops[3] = {
        {"decode_op", &b.decode_op}, {"prefill_op", &b.prefill_op}, {"sparse", &b.sparse}};
    for (const auto& [name, v] : ops)
      if (*v) io::write_dataset(bg.get(), name, DType::kF64, {2}, (*v)->data(), wb);
  }
}

}  // namespace golden

// ---------------------------------------------------------------- export

namespace {

// err_baseline's parts, computed as a run computes them (the emulation against
// the references just made) for everything a run may ask: the layer op in both
// forms for every request (which requests a backend routes through which form
// is the backend's choice), and the kernel-level ops exported. Models whose
// dtype the emulation does not take (fp32) store none: a run computes nothing
// for them either.
std::optional<StoredBaselines> export_baselines(const PreparedCase& pc, const std::vector<Op>& ops) {
  const Case& c = pc.c;
  if (c.spec.dtype != DType::kBF16 && c.spec.dtype != DType::kF16) return std::nullopt;
  StoredBaselines b;
  auto both = [](const std::vector<double>& eo, const std::vector<double>& go, const std::vector<double>& el,
                 const std::vector<double>& gl) {
    return std::array<double, 2>{baseline_error(eo, go, 0, eo.size()), baseline_error(el, gl, 0, el.size())};
  };
  if (pc.sparse) {
    const SparseReference e = sparse_emulation(c, pc.sparse->q.view());
    b.sparse = both(e.o, pc.sparse->o, e.lse, pc.sparse->lse);
    return b;
  }
  if (!pc.reference) return std::nullopt;
  std::vector<int> all(static_cast<std::size_t>(c.num_requests));
  for (int i = 0; i < c.num_requests; ++i) all[static_cast<std::size_t>(i)] = i;
  KvProjection projection(c);
  projection.ensure(all);
  for (int f = 0; f < 2; ++f) {
    const SdpaForm form = f == 0 ? SdpaForm::kDecode : SdpaForm::kPrefill;
    const SdpaResult e = emulate_sdpa_layer(c, form, all, &projection);
    layer_baseline_errors(c, e, pc.reference->out, pc.reference->lse, all, b.layer_out[f], b.layer_lse[f]);
  }
  if (pc.decode) {
    const SdpaResult e = emulate_sdpa_decode_op(c, pc.decode->q_lat.view());
    // The larger error of the decode kernel's two plain implementations (sdpa_emulation.h).
    b.decode_op = {baseline_error(e, false, pc.decode->o_lat, 0, e.out.size()),
                   baseline_error(e, true, pc.decode->lse, 0, e.lse.size())};
  }
  if (std::find(ops.begin(), ops.end(), Op::kPrefill) != ops.end()) {
    const SdpaResult e = emulate_sdpa_prefill_op(c, projection.k_all().view(), projection.v_all().view(), &projection);
    b.prefill_op = both(e.out, pc.reference->out, e.lse, pc.reference->lse);
  }
  return b;
}

}  // namespace

PreparedCase prepare_export_case(const CaseSpec& spec, const ExportOptions& opt) {
  PreparedCase pc;
  if (spec.merge.active()) {
    // A merge case: its two partial results and the fp64 merge; no cache, no
    // stored err_baseline (two fp32 merges of the stored inputs, computed by the run).
    pc.c = generate_case(spec);
    pc.merge = reference_merge(*pc.c.merge);
    return pc;
  }
  // A golden file stores every cache byte: a pool past 2 GiB is not for HDF5.
  if (spec.layout.pool != PoolSize::kFitted)
    throw InputError("export: case " + spec.id() + ": layout " + layout_name(spec.layout) +
                     " places its pages past 2^31 bytes of a pool, which a golden file would store whole; export "
                     "the case without the pool part (the values are the same)");
  pc.c = generate_case(spec);
  if (spec.sparse.active()) {
    // Sparse cases: the sparse ops' query and reference only (no dense op runs them).
    pc.sparse = golden::compute_sparse_reference(pc.c);
  } else {
    ReferenceOutputs g = reference_absorbed(pc.c);
    g.o_lat.clear();  // no op compares against it; the decode op has its own reference
    pc.reference = std::move(g);
  }
  std::vector<int> sizes;
  if (spec.block_size != 0) sizes = {spec.block_size};
  else if (opt.block_sizes) sizes = opt.block_sizes(spec);
  if (sizes.empty()) throw InputError("export: no block size to store a cache for (case " + spec.id() + ")");
  CacheOptions co = opt.cache;
  co.write_new_tokens = false;  // the layer op's cache_write fills the new tokens
  for (int bs : sizes)
    if (!pc.caches.count(bs)) pc.caches.emplace(bs, build_paged_cache(pc.c, bs, co));
  if (!spec.sparse.active() && std::find(opt.ops.begin(), opt.ops.end(), Op::kDecode) != opt.ops.end()) {
    PreparedCase::DecodeReference d;
    std::vector<int> tokens(static_cast<std::size_t>(pc.c.num_tokens));
    for (int t = 0; t < pc.c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
    absorb_queries(pc.c, tokens, d.q_lat, d.q_pe);
    reference_mqa(pc.c, d.q_lat.view(), d.o_lat, d.lse);
    pc.decode = std::move(d);
  }
  pc.baselines = export_baselines(pc, opt.ops);
  return pc;
}

ExportSummary export_golden(const std::vector<CaseSpec>& cases, const std::string& path, const ExportOptions& opt) {
  golden::TempH5 file(path, FileKind::kGolden, opt.command_line);
  ExportSummary sum;
  std::set<std::string> seen;
  for (const CaseSpec& spec : cases) {
    const std::string id = spec.id();
    if (!seen.insert(id).second) continue;  // the same id is the same content
    const PreparedCase pc = prepare_export_case(spec, opt);
    bool created = false;
    const hid_t g = file.case_group(id, created);
    const golden::io::Where w = file.where() / (std::string(golden::schema::kCasesGroup) + "/" + id);
    const InputHashes h = input_hashes(pc.c);
    golden::write_case_header(g, spec, &h, opt.policy, w);
    golden::write_case_content(g, pc, w);
    ++sum.cases;
    sum.caches += pc.caches.size();
    if (opt.after_case) opt.after_case(sum.cases, id);
  }
  file.commit();
  sum.file_bytes = std::filesystem::file_size(path);
  return sum;
}

// ---------------------------------------------------------------- results

struct ResultsWriter::Impl {
  golden::TempH5 file;
  std::set<std::string> records;  // "case\nbackend\nop"
  Impl(const std::string& path, const std::string& cmd) : file(path, FileKind::kResults, cmd) {}
};

ResultsWriter::ResultsWriter(const std::string& path, const std::string& command_line, const std::string& shard)
    : impl_(std::make_unique<Impl>(path, command_line)) {
  if (!shard.empty()) golden::io::write_attr(impl_->file.root(), "shard", shard, impl_->file.where());
}
ResultsWriter::~ResultsWriter() = default;

void ResultsWriter::add_case(const CaseSpec& spec, const Case* c, const Policy& policy) {
  const std::string id = spec.id();
  bool created = false;
  const hid_t g = impl_->file.case_group(id, created);
  if (!created) return;
  const golden::io::Where w = impl_->file.where() / (std::string(golden::schema::kCasesGroup) + "/" + id);
  if (c) {
    const InputHashes h = input_hashes(*c);
    golden::write_case_header(g, spec, &h, policy, w);
  } else {
    // A case that could not be generated: its id and the records' statuses only.
    golden::io::write_attr(g, "schema", kGoldenSchema, w);
    golden::io::write_attr(g, "schema_version", kGoldenSchemaVersion, w);
    golden::io::write_attr(g, "case_id", id, w);
    golden::io::write_attr(g, "valid", 0, w);
  }
}

bool ResultsWriter::has_record(const Record& r) const {
  return impl_->records.count(r.case_id + "\n" + r.backend + "\n" + r.op) > 0;
}

namespace golden {
std::string clip_message(const std::string& s) { return clip(s); }
}  // namespace golden

void ResultsWriter::add_record(const Record& r, std::span<const Output> outputs) {
  namespace io = golden::io;
  const auto clip = golden::clip_message;
  if (!impl_->records.insert(r.case_id + "\n" + r.backend + "\n" + r.op).second)
    throw std::logic_error("results file: record " + r.case_id + " " + r.backend + " " + r.op + " written twice");
  for (const std::string& name : {r.backend, r.op})
    if (name.empty() || name == "." || name.find('/') != std::string::npos)
      throw GoldenFileError("results file: '" + name + "' cannot name an HDF5 group");
  bool created = false;
  const hid_t cg = impl_->file.case_group(r.case_id, created);
  if (created) {  // a record of a case never added: its id and statuses only
    const io::Where wc = impl_->file.where() / (std::string(golden::schema::kCasesGroup) + "/" + r.case_id);
    io::write_attr(cg, "schema", kGoldenSchema, wc);
    io::write_attr(cg, "schema_version", kGoldenSchemaVersion, wc);
    io::write_attr(cg, "case_id", r.case_id, wc);
    io::write_attr(cg, "valid", 0, wc);
  }
  const std::string path = std::string(golden::schema::kCasesGroup) + "/" + r.case_id + "/" +
                           golden::schema::kResultsGroup + "/" + r.backend + "/" + r.op;
  const hid_t g = impl_->file.group(path, created);
  const io::Where w = impl_->file.where() / path;
  io::write_attr(g, "status", std::string(status_name(r.status)), w);
  io::write_attr(g, "message", clip(r.message), w);
  io::write_attr(g, "policy", r.policy, w);
  io::write_attr(g, "repro", clip(r.repro), w);
  io::write_attr(g, "block_size", r.block_size, w);
  std::string paths;
  for (const auto& p : r.paths) paths += (paths.empty() ? "" : ",") + p;
  io::write_attr(g, "paths", clip(paths), w);
  io::write_attr(g, "run_ms", r.timings.run_ms, w);
  io::write_attr(g, "reference_ms", r.timings.reference_ms, w);
  for (const Output& po : outputs) {
    const TensorView& v = po.data;
    io::write_dataset(g, po.name, v.dtype, v.shape, v.data, w);
    const golden::h5::Dataset ds = golden::h5::dopen(g, po.name, (w / po.name).str());
    const io::Where wo = w / po.name;
    for (const Metrics& m : r.metrics) {
      if (m.output != po.name) continue;
      const hid_t d = ds.get();
      io::write_attr(d, "max_abs", m.max_abs, wo);
      io::write_attr(d, "max_rel", m.max_rel, wo);
      io::write_attr(d, "rel_floor", m.rel_floor, wo);
      io::write_attr(d, "mean_abs", m.mean_abs, wo);
      io::write_attr(d, "nmse", m.nmse, wo);
      io::write_attr(d, "cos_diff", m.cos_diff, wo);
      io::write_attr(d, "max_ulp", m.max_ulp, wo);
      io::write_attr(d, "ref_norm", m.ref_norm, wo);
      io::write_attr(d, "out_norm", m.out_norm, wo);
      io::write_attr(d, "min_atol", m.min_atol, wo);
      io::write_attr(d, "nonfinite_mismatches", m.nonfinite_mismatches, wo);
      io::write_attr(d, "worst", m.worst.str(), wo);
      io::write_attr(d, "worst_flat", m.worst.flat, wo);
      io::write_attr(d, "passed", m.passed ? 1 : 0, wo);
      io::write_attr(d, "message", clip(m.message), wo);
      break;
    }
  }
}

void ResultsWriter::commit() { impl_->file.commit(); }

}  // namespace mlagate
