// Reading schema v1 with every value validated before use: root provenance,
// case attributes through CaseSpec::validate, dataset shapes against them,
// content hashes, block ids < num_blocks, the slot mapping, a memory budget.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "cases/format.h"
#include "golden/detail/h5.h"
#include "golden/detail/io.h"
#include "golden/detail/results_reader.h"
#include "golden/detail/schema.h"
#include "golden/detail/sparse_io.h"
#include "golden/detail/merge_states_io.h"
#include "golden/golden_file.h"

namespace mlagate {

namespace {

namespace io = golden::io;
namespace h5 = golden::h5;
namespace schema = golden::schema;
using io::bad;
using io::Where;

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
constexpr std::int64_t kIntMin = std::numeric_limits<int>::min();

std::string fmt_value(double v) { return format_g(v, 9); }

// A stored reference is exact fp64 arithmetic on finite inputs: every value is
// finite, except the lse of a row that sees no key (a seq_len-0 padding
// request), which is -inf. A NaN there would make every backend look
// NONFINITE, so it is a corrupt file, refused before any backend runs.
// `dim` is the elements per (token, head); lse has dim 1.
void check_reference(const std::vector<double>& v, const CaseHeader& h, std::int64_t heads, std::int64_t dim, bool is_lse,
                     const Where& w) {
  const CaseSpec& s = h.spec;
  const Layout layout{h.query_start_loc, heads, dim};
  const std::int64_t per_token = heads * dim;
  for (std::size_t i = 0; i < s.batch.seq_lens.size(); ++i) {
    const std::int64_t seq = s.batch.seq_lens[i], q = s.batch.query_lens[i];
    for (std::int64_t u = 0; u < q; ++u) {
      const bool empty = std::clamp<std::int64_t>(seq - q + u + 1, 0, seq) == 0;
      const std::int64_t t = h.query_start_loc[i] + u;
      for (std::int64_t k = t * per_token; k < (t + 1) * per_token; ++k) {
        const double x = v[static_cast<std::size_t>(k)];
        if (is_lse && empty) {
          if (x != -std::numeric_limits<double>::infinity())
            bad(w, "element " + std::to_string(k) + " (" + layout.locate(k).str() + ") is " + fmt_value(x) +
                       " for a row that sees no key; the reference there is -inf (corrupt file)");
        } else if (!std::isfinite(x)) {
          bad(w, "element " + std::to_string(k) + " (" + layout.locate(k).str() + ") is " + fmt_value(x) +
                     ": a stored reference must be finite" + (is_lse ? " (-inf only for a row that sees no key)" : "") +
                     " (corrupt file)");
        }
      }
    }
  }
}

}  // namespace

struct GoldenReader::Impl {
  std::string path;
  Where root;
  h5::File file;
  FileInfo info;
  std::vector<std::string> ids;
  std::set<std::string> id_set;
  std::uint64_t max_bytes;

  Where case_where(const std::string& id) const { return root / (std::string(schema::kCasesGroup) + "/" + id); }

  h5::Group open_case(const std::string& id) {
    if (!id_set.count(id)) throw GoldenFileError(path + ": no case '" + id + "' in this file");
    Where w = root / schema::kCasesGroup;
    h5::Group g = io::open_group(file.get(), schema::kCasesGroup, root);
    for (const std::string& part : schema::id_path(id)) {
      h5::Group next = io::open_group(g.get(), part, w);
      w = w / part;
      g = std::move(next);
    }
    return g;
  }

  CaseHeader read_header(hid_t g, const std::string& id, io::Budget& budget) {
    const Where w = case_where(id);
    CaseHeader h;
    h.id = id;
    if (io::read_string(g, "schema", w, 256) != kGoldenSchema) bad(w, "schema attribute is not " + std::string(kGoldenSchema));
    io::read_int(g, "schema_version", w, kGoldenSchemaVersion, kGoldenSchemaVersion);
    if (io::read_string(g, "case_id", w, schema::kMaxIdBytes) != id) bad(w, "case_id attribute differs from the group's path");
    h.valid = io::read_int(g, "valid", w, 0, 1) == 1;
    if (!h.valid) {
      if (info.kind == FileKind::kGolden) bad(w, "a golden file cannot hold an invalid case");
      return h;
    }
    CaseSpec& s = h.spec;
    s.suite = io::read_string(g, "suite", w, 1024);
    s.batch.name = io::read_string(g, "batch_name", w, 1024);
    s.batch.note = io::read_string(g, "batch_note", w);
    s.batch.spec_decode = io::read_int(g, "spec_decode", w, 0, 1) == 1;
    s.total_heads = static_cast<int>(io::read_int(g, "total_heads", w, kIntMin, kIntMax));
    s.tp = static_cast<int>(io::read_int(g, "tp", w, kIntMin, kIntMax));
    try {
      // float32: a merge case's output dtype (validate() refuses it elsewhere).
      const std::string dt = io::read_string(g, "dtype", w, 64);
      s.dtype = dt == "float32" ? DType::kF32 : parse_model_dtype(dt);
      const KvCacheFormat f = parse_kv_cache_format(io::read_string(g, "kv_cache_dtype", w, 64));
      s.kv_cache_dtype = f.dtype;
      s.scale_rule = f.scale_rule;
    } catch (const GoldenFileError&) {
      throw;
    } catch (const InputError& e) {
      bad(w, e.what());
    }
    s.block_size = static_cast<int>(io::read_int(g, "block_size", w, kIntMin, kIntMax));
    s.seed = io::read_u64(g, "seed", w);
    s.q_magnitude = io::read_double(g, "q_magnitude", w);
    const double scale = io::read_double(g, "scale", w);
    if (io::read_int(g, "scale_is_default", w, 0, 1) == 0) s.scale = scale;
    const double ks = io::read_double(g, "k_scale", w);
    if (!(std::fabs(ks) <= std::numeric_limits<float>::max())) bad(w, "k_scale out of range");
    s.k_scale = static_cast<float>(ks);
    if (io::has_attr(g, "reference_k_scale", w)) {
      if (io::read_string(g, "reference_k_scale", w) != "model_dtype") bad(w, "reference_k_scale must be model_dtype");
      s.reference_k_scale_rounded = true;
    }
    s.dims.kv_lora_rank = static_cast<int>(io::read_int(g, "kv_lora_rank", w, kIntMin, kIntMax));
    s.dims.rope_dim = static_cast<int>(io::read_int(g, "rope_dim", w, kIntMin, kIntMax));
    s.dims.nope_dim = static_cast<int>(io::read_int(g, "nope_dim", w, kIntMin, kIntMax));
    s.dims.v_head_dim = static_cast<int>(io::read_int(g, "v_head_dim", w, kIntMin, kIntMax));
    const std::int64_t B = io::read_int(g, "num_requests", w, 1, schema::kMaxRequests);
    const std::vector<std::int32_t> seq = io::i32_values(io::read_tensor(g, "seq_lens", DType::kI32, {B}, w, budget));
    const std::vector<std::int32_t> ql = io::i32_values(io::read_tensor(g, "query_lens", DType::kI32, {B}, w, budget));
    s.batch.seq_lens.assign(seq.begin(), seq.end());
    s.batch.query_lens.assign(ql.begin(), ql.end());
    s.sparse = golden::read_sparse_spec(g, w);
    if (io::has_attr(g, "merge_head_dim", w)) {
      s.merge.head_dim = static_cast<int>(io::read_int(g, "merge_head_dim", w, 1, 4096));
      try {
        s.merge.lse = parse_lse_pattern(io::read_string(g, "merge_lse", w, 64));
      } catch (const GoldenFileError&) {
        throw;
      } catch (const InputError& e) {
        bad(w, e.what());
      }
      s.merge.gap = io::read_double(g, "merge_lse_gap", w);
    }
    if (io::has_attr(g, "layout", w)) {
      try {
        s.layout = parse_layout(io::read_string(g, "layout", w, 64));
      } catch (const InputError& e) {
        bad(w, e.what());
      }
    }
    if (io::has_attr(g, "ops", w)) {
      const std::string ops = io::read_string(g, "ops", w, 256);
      try {
        s.ops = parse_op_names(ops, "ops");
      } catch (const InputError& e) {
        bad(w, e.what());
      }
    }
    // Token counts are ints in Case: their sums must not overflow.
    std::int64_t sum_s = 0, sum_q = 0;
    for (std::int64_t i = 0; i < B; ++i) sum_s += seq[static_cast<std::size_t>(i)], sum_q += ql[static_cast<std::size_t>(i)];
    if (sum_s > kIntMax || sum_q > kIntMax) bad(w, "total tokens exceed the int range");
    // The limits of a run apply to a file: lengths, dims, heads, sizes.
    try {
      s.validate();
    } catch (const InvalidCase& e) {
      bad(w, std::string("invalid case parameters: ") + e.what());
    }
    if (s.id() != id) bad(w, "the attributes describe case '" + s.id() + "', not the group's id");
    if (io::read_int(g, "num_heads", w, kIntMin, kIntMax) != s.num_heads()) bad(w, "num_heads disagrees with total_heads / tp");
    if (io::read_int(g, "num_tokens", w, kIntMin, kIntMax) != s.num_tokens()) bad(w, "num_tokens disagrees with query_lens");
    if (io::read_int(g, "num_kv_tokens", w, kIntMin, kIntMax) != s.num_kv_tokens()) bad(w, "num_kv_tokens disagrees with seq_lens");
    h.query_start_loc = io::i32_values(io::read_tensor(g, "query_start_loc", DType::kI32, {B + 1}, w, budget));
    std::int32_t acc = 0;
    for (std::int64_t i = 0; i <= B; ++i) {
      if (h.query_start_loc[static_cast<std::size_t>(i)] != acc) bad(w, "query_start_loc is not the prefix sum of query_lens");
      if (i < B) acc += ql[static_cast<std::size_t>(i)];
    }
    h.policy = io::read_string(g, "policy", w, 1024);
    h.hashes.combined = io::read_hash(g, "input_hash", w);
    std::uint64_t* each[5] = {&h.hashes.q, &h.hashes.kv_c, &h.hashes.k_pe, &h.hashes.w_uk, &h.hashes.w_uv};
    for (std::size_t i = 0; i < 5; ++i) *each[i] = io::read_hash(g, std::string("hash_") + schema::kInputNames[i], w);
    // xxh64_<name>: all five or none (files written before they were stored).
    int xxh_attrs = 0;
    for (std::size_t i = 0; i < 5; ++i) xxh_attrs += io::has_attr(g, std::string("xxh64_") + schema::kInputNames[i], w);
    if (xxh_attrs != 0 && xxh_attrs != 5) bad(w, "some of the xxh64_<input> attributes are missing (all five or none)");
    h.hashes.has_xxh = xxh_attrs == 5;
    for (std::size_t i = 0; h.hashes.has_xxh && i < 5; ++i)
      h.hashes.xxh[i] = io::read_hash(g, std::string("xxh64_") + schema::kInputNames[i], w);
    // A merge case's inputs are its merge_states group (SCHEMA.md, "Merge cases").
    h.has_inputs = io::has_link(g, s.merge.active() ? golden::kMergeGroup : schema::kInputsGroup, w);
    h.has_golden = io::has_link(g, schema::kGoldenGroup, w);
    h.has_decode = io::has_link(g, schema::kDecodeGroup, w);
    if (io::has_link(g, schema::kCacheGroup, w)) {
      const h5::Group cg = io::open_group(g, schema::kCacheGroup, w);
      for (const std::string& name : io::list_group(cg.get(), w / schema::kCacheGroup, 64)) {
        int bs = 0;
        if (name.size() < 3 || name.size() > 6 || name.compare(0, 2, "bs") != 0 ||
            name.find_first_not_of("0123456789", 2) != std::string::npos || (bs = std::stoi(name.substr(2))) < 1 ||
            bs > 1024 || (bs & (bs - 1)) != 0 || name != schema::cache_group_name(bs))
          bad(w / schema::kCacheGroup, "unexpected member '" + name + "' (cache groups are bs<power of two <= 1024>)");
        h.cache_block_sizes.push_back(bs);
      }
      std::sort(h.cache_block_sizes.begin(), h.cache_block_sizes.end());
    }
    return h;
  }

  // Every group below /cases is a listed case, on the path to one, or a member
  // of one: a case group that /case_ids does not list (records, inputs) would
  // be silently ignored by every command, so the file is refused instead.
  void check_case_tree() {
    std::set<std::string> on_path;  // every listed id and each of its prefixes
    for (const std::string& id : ids) {
      std::string acc;
      for (const std::string& part : schema::id_path(id)) {
        acc += (acc.empty() ? "" : "/") + part;
        on_path.insert(acc);
      }
    }
    if (ids.empty() && !io::has_link(file.get(), schema::kCasesGroup, root)) return;
    const h5::Group g = io::open_group(file.get(), schema::kCasesGroup, root);
    walk_cases(g.get(), "", root / schema::kCasesGroup, on_path);
  }

  void walk_cases(hid_t g, const std::string& rel, const Where& w, const std::set<std::string>& on_path) {
    const bool is_case = id_set.count(rel) > 0;
    for (const std::string& name : io::list_group(g, w, schema::kMaxMembers)) {
      const std::string child = rel.empty() ? name : rel + "/" + name;
      if (!io::has_link(g, name, w)) continue;  // throws for soft and external links
      if (on_path.count(child)) {
        const h5::Group cg = io::open_group(g, name, w);
        walk_cases(cg.get(), child, w / name, on_path);
      } else if (is_case) {
        // The case's own members are checked when the case is read; only a
        // case hidden among them is refused here.
        if (h5::is_group(g, name, (w / name).str())) {
          const h5::Group cg = io::open_group(g, name, w);
          refuse_hidden_cases(cg.get(), w / name, 0);
        }
      } else {
        bad(w / name, "'" + child +
                          "' is neither a case that /case_ids lists nor on the path to one (the case list and the case "
                          "groups disagree)");
      }
    }
  }

  void refuse_hidden_cases(hid_t g, const Where& w, int depth) {
    if (io::has_attr(g, "case_id", w))
      bad(w, "a case group ('" + io::read_string(g, "case_id", w, schema::kMaxIdBytes) +
                 "') that /case_ids does not list (the case list and the case groups disagree)");
    if (depth >= 16) return;
    for (const std::string& name : io::list_group(g, w, schema::kMaxMembers)) {
      if (!io::has_link(g, name, w) || !h5::is_group(g, name, (w / name).str())) continue;
      const h5::Group cg = io::open_group(g, name, w);
      refuse_hidden_cases(cg.get(), w / name, depth + 1);
    }
  }

  CaseHeader header(const std::string& id) {
    const h5::Group g = open_case(id);
    io::Budget budget(max_bytes);
    return read_header(g.get(), id, budget);
  }

  ReferenceOutputs read_reference(hid_t g, const CaseHeader& h, io::Budget& budget) {
    const Where w = case_where(h.id);
    if (!h.has_golden) bad(w, "no golden group");
    const h5::Group gg = io::open_group(g, schema::kGoldenGroup, w);
    const Where wg = w / schema::kGoldenGroup;
    const std::int64_t T = h.spec.num_tokens(), N = h.spec.num_heads(), V = h.spec.dims.v_head_dim;
    ReferenceOutputs out;
    out.out = io::f64_values(io::read_tensor(gg.get(), "out", DType::kF64, {T, N * V}, wg, budget));
    out.lse = io::f64_values(io::read_tensor(gg.get(), "lse", DType::kF64, {T, N}, wg, budget));
    check_reference(out.out, h, N, V, false, wg / "out");
    check_reference(out.lse, h, N, 1, true, wg / "lse");
    return out;
  }

  std::optional<PreparedCase::DecodeReference> read_decode(hid_t g, const CaseHeader& h, io::Budget& budget) {
    if (!h.has_decode) return std::nullopt;
    const Where w = case_where(h.id);
    const h5::Group dg = io::open_group(g, schema::kDecodeGroup, w);
    const Where wd = w / schema::kDecodeGroup;
    const std::int64_t T = h.spec.num_tokens(), N = h.spec.num_heads();
    const Dims& d = h.spec.dims;
    PreparedCase::DecodeReference r;
    r.q_lat = io::read_tensor(dg.get(), "q_lat", h.spec.dtype, {T, N, d.kv_lora_rank}, wd, budget);
    r.q_pe = io::read_tensor(dg.get(), "q_pe", h.spec.dtype, {T, N, d.rope_dim}, wd, budget);
    r.o_lat = io::f64_values(io::read_tensor(dg.get(), "o_lat", DType::kF64, {T, N, d.kv_lora_rank}, wd, budget));
    r.lse = io::f64_values(io::read_tensor(dg.get(), "lse", DType::kF64, {T, N}, wd, budget));
    check_reference(r.o_lat, h, N, d.kv_lora_rank, false, wd / "o_lat");
    check_reference(r.lse, h, N, 1, true, wd / "lse");
    return r;
  }

  // A per-case part that only a valid (generated) case has: none otherwise.
  template <class T>
  std::optional<T> read_optional(const std::string& id,
                                 std::optional<T> (Impl::*read)(hid_t, const CaseHeader&, io::Budget&)) {
    const h5::Group g = open_case(id);
    io::Budget budget(max_bytes);
    const CaseHeader h = read_header(g.get(), id, budget);
    if (!h.valid) return std::nullopt;
    return (this->*read)(g.get(), h, budget);
  }

  // err_baseline parts (export's emulation): each NaN (not stored) or a
  // finite error >= 0. Files without the group give none (computed by the run).
  std::optional<StoredBaselines> read_baselines(hid_t g, const CaseHeader& h, io::Budget& budget) {
    const Where w = case_where(h.id);
    if (!io::has_link(g, schema::kBaselineGroup, w)) return std::nullopt;
    const h5::Group bg = io::open_group(g, schema::kBaselineGroup, w);
    const Where wb = w / schema::kBaselineGroup;
    auto check = [&](const std::vector<double>& v, const Where& wd) {
      for (double x : v)
        if (!std::isnan(x) && !(std::isfinite(x) && x >= 0))
          bad(wd, "an err_baseline value is negative or infinite (" + std::to_string(x) + ")");
    };
    StoredBaselines b;
    if (io::has_link(bg.get(), "layer_out", wb) || io::has_link(bg.get(), "layer_lse", wb)) {
      if (h.spec.sparse.active()) bad(wb, "layer err_baseline stored for a sparse case");
      const std::int64_t B = h.spec.num_requests();
      for (const char* name : {"layer_out", "layer_lse"}) {
        const std::vector<double> v = io::f64_values(io::read_tensor(bg.get(), name, DType::kF64, {2, B}, wb, budget));
        check(v, wb / name);
        auto& dst = std::string(name) == "layer_out" ? b.layer_out : b.layer_lse;
        dst[0].assign(v.begin(), v.begin() + B);
        dst[1].assign(v.begin() + B, v.end());
      }
    }
    const std::pair<const char*, std::optional<std::array<double, 2>>*> ops[3] = {
        {"decode_op", &b.decode_op}, {"prefill_op", &b.prefill_op}, {"sparse", &b.sparse}};
    for (const auto& [name, dst] : ops) {
      if (!io::has_link(bg.get(), name, wb)) continue;
      const std::vector<double> v = io::f64_values(io::read_tensor(bg.get(), name, DType::kF64, {2}, wb, budget));
      check(v, wb / name);
      *dst = std::array<double, 2>{v[0], v[1]};
    }
    if (b.decode_op && !h.has_decode) bad(wb / "decode_op", "stored without the case's decode group");
    if (b.sparse && !h.spec.sparse.active()) bad(wb / "sparse", "stored for a dense case");
    return b;
  }

  // A stored cache, every index in it checked against the case before any
  // backend may read through it.
  // check_data_only: the data's storage and attributes are checked, its bytes
  // not read (run --golden rebuilds the cache); the small block table and
  // slot mapping are read and checked as always.
  PagedCache read_cache(hid_t cg, const Case& c, int bs, const Where& wc, io::Budget& budget, bool check_data_only = false) {
    const std::string name = schema::cache_group_name(bs);
    const h5::Group g = io::open_group(cg, name, wc);
    const Where w = wc / name;
    const CaseSpec& spec = c.spec;
    // The format (kv dtype, element dtype, entry size, data layout) as cases/ builds it.
    PagedCache pc = schema::cache_template(spec, bs);
    if (io::read_int(g.get(), "block_size", w, bs, bs) != bs) bad(w, "block_size disagrees with the group name");
    if (io::read_string(g.get(), "kv_cache_dtype", w, 64) != kv_cache_dtype_name(pc.kv_dtype))
      bad(w, "kv_cache_dtype differs from the case's");
    if (io::read_string(g.get(), "elem_dtype", w, 64) != dtype_name(pc.elem_dtype)) bad(w, "elem_dtype differs from the case's");
    const std::int64_t entry = io::read_int(g.get(), "entry_bytes", w, 1, 1 << 20);
    if (entry != pc.entry_bytes)
      bad(w, "entry_bytes " + std::to_string(entry) + ", but this case's cache format has " + std::to_string(pc.entry_bytes));
    if (io::read_int(g.get(), "new_tokens_written", w, 0, 1) != 0) bad(w, "a stored cache must not hold the new tokens");
    try {
      pc.options.poison = parse_poison(io::read_string(g.get(), "poison", w, 64));
    } catch (const GoldenFileError&) {
      throw;
    } catch (const InputError& e) {
      bad(w, e.what());
    }
    pc.options.poison_block_table = io::read_int(g.get(), "poison_block_table", w, 0, 1) == 1;
    pc.options.write_new_tokens = false;
    std::int64_t used = 0, widest = 1;
    for (int i = 0; i < c.num_requests; ++i) {
      const std::int64_t nb = (std::int64_t{c.seq_lens[static_cast<std::size_t>(i)]} + bs - 1) / bs;
      used += nb;
      widest = std::max(widest, nb);
    }
    if (io::read_int(g.get(), "used_blocks", w, 0, kIntMax) != used)
      bad(w, "used_blocks disagrees with seq_lens (expected " + std::to_string(used) + ")");
    const std::int64_t spare = io::read_int(g.get(), "spare_blocks", w, 0, kIntMax);
    const std::int64_t num_blocks = io::read_int(g.get(), "num_blocks", w, 1, kIntMax);
    if (num_blocks != used + 1 + spare) bad(w, "num_blocks != used_blocks + 1 + spare_blocks");
    const std::int64_t divisor = std::max(1, 128 / bs);
    const std::int64_t width = io::read_int(g.get(), "table_width", w, 1, kIntMax);
    if (width < widest || width % divisor != 0 || width > (widest + divisor - 1) / divisor * divisor)
      bad(w, "table_width " + std::to_string(width) + " does not fit the longest request (" + std::to_string(widest) +
                 " blocks, padded to a multiple of " + std::to_string(divisor) + ")");
    pc.block_size = bs;
    pc.num_blocks = static_cast<int>(num_blocks);
    pc.used_blocks = static_cast<int>(used);
    pc.table_width = static_cast<int>(width);
    pc.options.spare_blocks = static_cast<int>(spare);

    Shape data_shape = pc.data.shape();
    data_shape.at(0) = num_blocks;
    if (check_data_only) io::check_tensor(g.get(), "data", DType::kU8, data_shape, w);
    else pc.data = io::read_tensor(g.get(), "data", DType::kU8, data_shape, w, budget);
    pc.block_table = io::read_tensor(g.get(), "block_table", DType::kI32, {c.num_requests, width}, w, budget);
    pc.slot_mapping = io::read_tensor(g.get(), "slot_mapping", DType::kI64, {c.num_tokens}, w, budget);

    // Block ids: each request's blocks in [1, num_blocks), no block twice; the
    // unused tail exactly the recorded filler.
    const std::int32_t* bt = pc.block_table.data<std::int32_t>();
    const std::int32_t filler = pc.options.poison_block_table ? kPoisonBlockId : 0;
    std::vector<bool> taken(static_cast<std::size_t>(num_blocks), false);
    for (int i = 0; i < c.num_requests; ++i) {
      const std::int64_t nb = (std::int64_t{c.seq_lens[static_cast<std::size_t>(i)]} + bs - 1) / bs;
      for (std::int64_t j = 0; j < width; ++j) {
        const std::int32_t id = bt[i * width + j];
        const std::string at = "block_table[" + std::to_string(i) + ", " + std::to_string(j) + "]";
        if (j >= nb) {
          if (id != filler) bad(w, at + " = " + std::to_string(id) + " past the request's blocks, expected " + std::to_string(filler));
          continue;
        }
        if (id < 1 || id >= num_blocks)
          bad(w, at + ": block id " + std::to_string(id) + " is out of range [1, " + std::to_string(num_blocks) + ")");
        if (taken[static_cast<std::size_t>(id)]) bad(w, at + ": block " + std::to_string(id) + " is used twice");
        taken[static_cast<std::size_t>(id)] = true;
      }
    }
    // Slot mapping: exactly the slots of the new tokens through the table.
    const std::int64_t* sm = pc.slot_mapping.data<std::int64_t>();
    for (int i = 0; i < c.num_requests; ++i) {
      const int s = c.seq_lens[static_cast<std::size_t>(i)], q = c.query_lens[static_cast<std::size_t>(i)];
      for (int u = 0; u < q; ++u) {
        const std::int64_t t = c.query_start_loc[static_cast<std::size_t>(i)] + u;
        const std::int64_t want = s == 0 ? -1 : pc.slot_of(i, s - q + u);
        if (sm[t] != want)
          bad(w, "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(sm[t]) + ", but the block table gives " +
                     std::to_string(want));
      }
    }
    return pc;
  }
};

GoldenReader::GoldenReader(const std::string& path, std::uint64_t max_bytes) : impl_(std::make_unique<Impl>()) {
  namespace fs = std::filesystem;
  Impl& m = *impl_;
  m.path = path;
  m.root = {path, "/"};
  m.max_bytes = max_bytes;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw GoldenFileError(path + ": no such file");
  if (!fs::is_regular_file(path, ec)) throw GoldenFileError(path + ": not a regular file");
  h5::init();
  if (!h5::is_hdf5(path)) throw GoldenFileError(path + ": not an HDF5 file (or its superblock is damaged)");
  const h5::PropList fapl = h5::pcreate(H5P_FILE_ACCESS, "file access properties");
  m.file = h5::fopen(path, H5F_ACC_RDONLY, fapl);
  const hid_t root = m.file.get();
  if (!io::has_attr(root, "schema", m.root) || io::read_string(root, "schema", m.root, 256) != kGoldenSchema)
    throw GoldenFileError(path + ": not an mlagate golden or results file (no schema attribute '" +
                          std::string(kGoldenSchema) + "')");
  const std::int64_t version = io::read_int(root, "schema_version", m.root, kIntMin, kIntMax);
  if (version != kGoldenSchemaVersion)
    throw GoldenFileError(path + ": schema version " + std::to_string(version) + " is not supported (this mlagate reads " +
                          std::to_string(kGoldenSchemaVersion) + ")");
  m.info.schema_version = static_cast<int>(version);
  const std::string kind = io::read_string(root, "file_kind", m.root, 64);
  if (kind == "golden") m.info.kind = FileKind::kGolden;
  else if (kind == "results") m.info.kind = FileKind::kResults;
  else bad(m.root, "file_kind '" + kind + "' is neither golden nor results");
  m.info.generator_version = static_cast<int>(io::read_int(root, "generator_version", m.root, 0, kIntMax));
  m.info.mlagate_version = io::read_string(root, "mlagate_version", m.root, 256);
  m.info.git_commit = io::read_string(root, "git_commit", m.root, 256);
  m.info.created_at = io::read_string(root, "created_at", m.root, 256);
  m.info.command_line = io::read_string(root, "command_line", m.root);
  if (io::has_attr(root, "shard", m.root)) m.info.shard = io::read_string(root, "shard", m.root, 64);
  const std::int64_t n = io::read_int(root, "num_cases", m.root, 0, static_cast<std::int64_t>(schema::kMaxCases));
  io::Budget budget(max_bytes);
  m.ids = io::read_strings(root, schema::kCaseIds, m.root, schema::kMaxCases, schema::kMaxIdBytes, budget);
  if (static_cast<std::int64_t>(m.ids.size()) != n) bad(m.root / schema::kCaseIds, "holds a different number of ids than num_cases");
  for (const auto& id : m.ids) {
    schema::id_path(id);
    if (!m.id_set.insert(id).second) bad(m.root / schema::kCaseIds, "case '" + id + "' is listed twice");
  }
}

GoldenReader::~GoldenReader() = default;
const std::string& GoldenReader::path() const { return impl_->path; }
const FileInfo& GoldenReader::info() const { return impl_->info; }
const std::vector<std::string>& GoldenReader::case_ids() const { return impl_->ids; }
bool GoldenReader::has_case(const std::string& id) const { return impl_->id_set.count(id) > 0; }

CaseHeader GoldenReader::header(const std::string& id) { return impl_->header(id); }

void GoldenReader::validate_all(ValidateScope scope) {
  Impl& m = *impl_;
  m.check_case_tree();
  for (const std::string& id : m.ids) {
    if (m.info.kind != FileKind::kGolden) {
      load_results(id);
    } else if (scope == ValidateScope::kEverything) {
      load_case(id);  // discarded: only the checks matter here
    } else {
      // What run --golden reads of a case: its header, references, stored
      // err_baseline and caches' recorded options (it regenerates the inputs
      // and caches and checks them against the stored hashes instead).
      const h5::Group g = m.open_case(id);
      io::Budget budget(m.max_bytes);
      const CaseHeader h = m.read_header(g.get(), id, budget);
      if (!h.valid || !h.has_inputs) bad(m.case_where(id), "no stored inputs (a results file holds outputs only)");
      if (h.spec.sparse.active() || h.spec.merge.active()) {
        load_case(id);  // the stored sparse sets or merge inputs are checked whole (small cases)
        continue;
      }
      const Where w = m.case_where(id);
      {
        const h5::Group in = io::open_group(g.get(), schema::kInputsGroup, w);
        const auto shapes = schema::input_shapes(h.spec);
        for (std::size_t i = 0; i < 5; ++i)
          io::check_tensor(in.get(), schema::kInputNames[i], h.spec.dtype, shapes[i], w / schema::kInputsGroup);
      }
      m.read_reference(g.get(), h, budget);
      m.read_decode(g.get(), h, budget);
      m.read_baselines(g.get(), h, budget);
      if (!h.cache_block_sizes.empty()) {
        const Case layout = case_layout(h.spec);
        const h5::Group cg = io::open_group(g.get(), schema::kCacheGroup, w);
        for (int bs : h.cache_block_sizes) {
          io::Budget cache_budget(m.max_bytes);
          m.read_cache(cg.get(), layout, bs, w / schema::kCacheGroup, cache_budget, true);
          cache_options(id, bs);
        }
      }
    }
  }
}

PreparedCase GoldenReader::load_case(const std::string& id) {
  Impl& m = *impl_;
  const h5::Group g = m.open_case(id);
  const Where w = m.case_where(id);
  io::Budget budget(m.max_bytes);
  const CaseHeader h = m.read_header(g.get(), id, budget);
  if (!h.valid || !h.has_inputs) bad(w, "no stored inputs (a results file holds outputs only: replay its golden file)");
  PreparedCase pc;
  pc.c = case_layout(h.spec);
  if (h.spec.merge.active()) {
    golden::StoredMerge st = golden::read_merge_group(g.get(), h.spec, w, budget);
    pc.c.merge = std::move(st.inputs);
    pc.merge = std::move(st.ref);
    pc.build_missing_caches = false;
    return pc;
  }
  {
    const h5::Group in = io::open_group(g.get(), schema::kInputsGroup, w);
    const Where wi = w / schema::kInputsGroup;
    const auto shapes = schema::input_shapes(h.spec);
    const auto dst = schema::input_tensors(pc.c);
    for (std::size_t i = 0; i < 5; ++i)
      *dst[i] = io::read_tensor(in.get(), schema::kInputNames[i], h.spec.dtype, shapes[i], wi, budget);
    // The datasets' own hashes were checked as they were read; the case's
    // hash_<name> (and xxh64_<name>) must describe the same bytes.
    const InputHashes got = input_hashes(pc.c);
    const std::uint64_t fnv_got[5] = {got.q, got.kv_c, got.k_pe, got.w_uk, got.w_uv};
    const std::uint64_t fnv_want[5] = {h.hashes.q, h.hashes.kv_c, h.hashes.k_pe, h.hashes.w_uk, h.hashes.w_uv};
    for (std::size_t i = 0; i < 5; ++i) {
      if (fnv_got[i] != fnv_want[i])
        bad(wi / schema::kInputNames[i], "content differs from the case's hash_" + std::string(schema::kInputNames[i]));
      if (h.hashes.has_xxh && got.xxh[i] != h.hashes.xxh[i])
        bad(wi / schema::kInputNames[i], "content differs from the case's xxh64_" + std::string(schema::kInputNames[i]));
    }
    if (got.combined != h.hashes.combined) bad(w, "inputs differ from the case's input_hash");
    // Values derived from the inputs and the spec alone (fp8 caches: the
    // latent as a correct reader sees it), as generate_case derives them.
    retarget_case(pc.c, h.spec);
  }
  if (h.spec.sparse.active()) {
    golden::StoredSparse st = golden::read_sparse_group(g.get(), pc.c, w, budget);
    pc.c.sparse = std::move(st.inputs);
    pc.sparse = std::move(st.ref);
  } else {
    pc.reference = m.read_reference(g.get(), h, budget);
  }
  pc.decode = m.read_decode(g.get(), h, budget);
  pc.baselines = m.read_baselines(g.get(), h, budget);
  if (!h.cache_block_sizes.empty()) {
    const h5::Group cg = io::open_group(g.get(), schema::kCacheGroup, w);
    for (int bs : h.cache_block_sizes) pc.caches.emplace(bs, m.read_cache(cg.get(), pc.c, bs, w / schema::kCacheGroup, budget));
  }
  pc.build_missing_caches = false;
  return pc;
}

ReferenceOutputs GoldenReader::load_reference(const std::string& id) {
  Impl& m = *impl_;
  const h5::Group g = m.open_case(id);
  io::Budget budget(m.max_bytes);
  const CaseHeader h = m.read_header(g.get(), id, budget);
  if (!h.valid) bad(m.case_where(id), "no golden for an invalid case");
  return m.read_reference(g.get(), h, budget);
}

PreparedCase::SparseReference GoldenReader::load_sparse(const std::string& id, const Case& c) {
  Impl& m = *impl_;
  const h5::Group g = m.open_case(id);
  io::Budget budget(m.max_bytes);
  golden::StoredSparse st = golden::read_sparse_group(g.get(), c, m.case_where(id), budget);
  // The stored sets must be the ones the generator gives this case.
  const SparseInputs& a = *st.inputs;
  const SparseInputs& b = *c.sparse;
  auto same = [](const IndexSet& x, const IndexSet& y) { return x.width == y.width && x.pos == y.pos && x.length == y.length; };
  if (!same(a.main, b.main) || !same(a.extra, b.extra) || a.sink != b.sink)
    bad(m.case_where(id) / golden::kSparseGroup,
        "stored index sets or sink differ from the regenerated ones: the generator or the case definition changed");
  return std::move(st.ref);
}

std::optional<StoredBaselines> GoldenReader::load_baselines(const std::string& id) {
  return impl_->read_optional(id, &Impl::read_baselines);
}

std::optional<PreparedCase::DecodeReference> GoldenReader::load_decode_reference(const std::string& id) {
  return impl_->read_optional(id, &Impl::read_decode);
}

std::vector<std::uint64_t> GoldenReader::stored_reference_hashes(const std::string& id) {
  Impl& m = *impl_;
  const h5::Group g = m.open_case(id);
  const Where w = m.case_where(id);
  struct Part {
    const char* group;
    std::vector<const char*> datasets;
  };
  const Part parts[3] = {{schema::kGoldenGroup, {"out", "lse"}},
                         {schema::kDecodeGroup, {"q_lat", "q_pe", "o_lat", "lse"}},
                         {schema::kBaselineGroup, {"layer_out", "layer_lse", "decode_op", "prefill_op", "sparse"}}};
  std::vector<std::uint64_t> out;
  for (const Part& part : parts) {
    const bool has = io::has_link(g.get(), part.group, w);
    out.push_back(has);
    if (!has) continue;
    const h5::Group pg = io::open_group(g.get(), part.group, w);
    const Where wp = w / part.group;
    for (const char* name : part.datasets) {
      const bool present = io::has_link(pg.get(), name, wp);
      out.push_back(present);
      if (!present) continue;
      const h5::Dataset ds = h5::dopen(pg.get(), name, (wp / name).str());
      const ContentHash ch = io::read_content_hash(ds.get(), wp / name);  // the one validate_all checked
      out.push_back(static_cast<std::uint64_t>(ch.kind));
      out.push_back(ch.value);
    }
  }
  return out;
}

StoredCacheOptions GoldenReader::cache_options(const std::string& id, int block_size) {
  Impl& m = *impl_;
  const h5::Group g = m.open_case(id);
  const Where w = m.case_where(id) / schema::kCacheGroup;
  const h5::Group cg = io::open_group(g.get(), schema::kCacheGroup, m.case_where(id));
  const std::string name = schema::cache_group_name(block_size);
  const h5::Group b = io::open_group(cg.get(), name, w);
  const Where wb = w / name;
  StoredCacheOptions o;
  try {
    o.poison = parse_poison(io::read_string(b.get(), "poison", wb, 64));
  } catch (const GoldenFileError&) {
    throw;
  } catch (const InputError& e) {
    bad(wb, e.what());
  }
  o.poison_block_table = io::read_int(b.get(), "poison_block_table", wb, 0, 1) == 1;
  o.spare_blocks = static_cast<int>(io::read_int(b.get(), "spare_blocks", wb, 0, kIntMax));
  ContentHash* hashes[3] = {&o.hash_data, &o.hash_block_table, &o.hash_slot_mapping};
  const char* names[3] = {"data", "block_table", "slot_mapping"};
  for (int i = 0; i < 3; ++i) {
    if (!io::has_link(b.get(), names[i], wb)) bad(wb / names[i], "missing dataset");
    const h5::Dataset ds = h5::dopen(b.get(), names[i], (wb / names[i]).str());
    *hashes[i] = io::read_content_hash(ds.get(), wb / names[i]);
  }
  return o;
}

std::vector<StoredResult> GoldenReader::load_results(const std::string& id) {
  Impl& m = *impl_;
  const h5::Group g = m.open_case(id);
  const Where w = m.case_where(id);
  io::Budget budget(m.max_bytes);
  const CaseHeader h = m.read_header(g.get(), id, budget);
  return golden::read_results(g.get(), w, h, budget);
}

}  // namespace mlagate
