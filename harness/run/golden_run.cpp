// run --golden, replay and --save-results as hooks on the runner: the runner's
// own comparison logic runs unchanged on cases made from a file.
#include "harness/run/golden_run.h"

#include <cstring>

#include <array>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>

#include "cases/generator.h"
#include "cases/merge.h"

namespace mlagate {

namespace {

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec)) return true;
  return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
}

const char* kInputLabels[5] = {"q", "kv_c", "k_pe", "W_UK", "W_UV"};

}  // namespace

struct GoldenRun::Impl {
  GoldenRunOptions opt;
  std::optional<GoldenReader> reader;  // --golden or replay
  std::optional<ResultsWriter> writer;  // --save-results
  std::map<std::string, CaseSpec> specs;  // by id, for records of cases that could not be made
  Policy policy;

  void require_case(const std::string& id) const {
    if (!reader->has_case(id))
      throw GoldenFileError(opt.golden + ": no case '" + id + "' (export it, or leave out --suite/--spec to run the file's cases)");
  }

  // The regenerated inputs must be the ones the file was exported from:
  // checked by XXH64 where the file stores it (memory speed), else by the
  // FNV-1a hashes every file has. The regenerated tensors are hashed once per
  // input set and process (its other kv dtypes retarget the same tensors);
  // every case's own stored hashes are compared with them.
  struct Computed {
    std::string key;  // inputs_key
    std::optional<std::array<std::uint64_t, 5>> xxh;
    std::optional<InputHashes> fnv;
  } computed;
  void check_regenerated(const Case& c, const CaseHeader& h) {
    const std::string key = inputs_key(c.spec);
    if (computed.key != key) computed = Computed{key, {}, {}};
    const std::string& id = h.id;
    auto differs = [&](int i, std::uint64_t mine, std::uint64_t stored, const char* kind) {
      throw GoldenFileError("case " + id + ": regenerated input " + kInputLabels[i] + " (" + kind + " " + hash_hex(mine) +
                            ") differs from the golden file's (" + kind + " " + hash_hex(stored) +
                            "): the generator or the case definition changed since " + opt.golden + " was exported");
    };
    if (h.hashes.has_xxh) {
      if (!computed.xxh) computed.xxh = input_xxh64(c);
      const std::array<std::uint64_t, 5>& mine = *computed.xxh;
      for (int i = 0; i < 5; ++i)
        if (mine[static_cast<std::size_t>(i)] != h.hashes.xxh[static_cast<std::size_t>(i)])
          differs(i, mine[static_cast<std::size_t>(i)], h.hashes.xxh[static_cast<std::size_t>(i)], "xxh64");
    } else {
      if (!computed.fnv) computed.fnv = input_hashes(c);
      const InputHashes& mine = *computed.fnv;
      const std::uint64_t a[5] = {mine.q, mine.kv_c, mine.k_pe, mine.w_uk, mine.w_uv};
      const std::uint64_t b[5] = {h.hashes.q, h.hashes.kv_c, h.hashes.k_pe, h.hashes.w_uk, h.hashes.w_uv};
      for (int i = 0; i < 5; ++i)
        if (a[i] != b[i]) differs(i, a[i], b[i], "fnv1a64");
      if (mine.combined != h.hashes.combined) throw GoldenFileError("case " + id + ": input_hash differs from the golden file's");
    }
  }

  // A stored cache is rebuilt with the run's poison options: they must be the file's.
  StoredCacheOptions stored_cache_options(const std::string& id, int bs, const ExecOptions& exec) {
    const StoredCacheOptions so = reader->cache_options(id, bs);
    if (so.poison != exec.poison || so.poison_block_table != exec.poison_block_table)
      throw GoldenFileError("case " + id + ": the golden file's bs=" + std::to_string(bs) + " cache was built with --poison " +
                            std::string(poison_name(so.poison)) + (so.poison_block_table ? " --poison-block-table" : "") +
                            ", this run uses --poison " + std::string(poison_name(exec.poison)) +
                            (exec.poison_block_table ? " --poison-block-table" : "") + ": run with the same options");
    return so;
  }

  // Rebuilt caches checked already, by cache_values_key, block size and poison
  // options (fp8 and fp8_e4m3 caches are the same bytes): their hashes.
  std::map<std::string, std::array<ContentHash, 3>> checked_caches;
  bool validated = false;  // validate() ran in this process
  // (id, golden/out) of the last kv=auto case, for its fp8 siblings; dropped
  // when the input set changes.
  struct AutoReference {
    std::string id, inputs;  // the case and its inputs_key
    std::vector<double> out;
  };
  std::optional<AutoReference> last_auto;

  // The previous case's tensors when its inputs are these (moved on by the
  // runner, as a plain run hands them on), else generated.
  static Case regenerate(const CaseSpec& spec, Case* previous) {
    if (previous && inputs_key(previous->spec) == inputs_key(spec)) {
      Case c = std::move(*previous);
      retarget_case(c, spec);  // validates spec (InvalidCase)
      return c;
    }
    return generate_case(spec);  // InvalidCase: INVALID_CASE records, as in a plain run
  }

  // fp8 caches: the quantization error's reference over the unquantized
  // inputs is the golden of the kv=auto case of the same inputs, when the file
  // holds that case (its input hashes equal this one's).
  void load_unquantized(const CaseSpec& spec, const CaseHeader& h, PreparedCase& pc) {
    if (!is_fp8(spec.kv_cache_dtype) || spec.sparse.active()) return;
    CaseSpec a = spec;
    a.kv_cache_dtype = KvCacheDtype::kAuto;
    a.scale_rule = ScaleRule::kPow2;
    a.k_scale = 1.f;
    const std::string aid = a.id();
    if (inputs_key(a) != inputs_key(spec) || !reader->has_case(aid)) return;
    const CaseHeader ah = reader->header(aid);
    if (!ah.has_golden || ah.hashes.combined != h.hashes.combined) return;
    if (last_auto && last_auto->id == aid) pc.unquantized = last_auto->out;  // read for that case just now
    else pc.unquantized = reader->load_reference(aid).out;
    if (pc.decode)
      if (auto d = reader->load_decode_reference(aid)) pc.unquantized_mqa = std::move(d->o_lat);
  }

  // The case from the file: inputs regenerated and checked against the
  // stored hashes, caches rebuilt and checked likewise, references read (and
  // checked against their content hashes as they are read). The check runs
  // where the case is made, in the worker of an isolated run (the tensors
  // hashed once per input set and cache, every case's stored hashes
  // compared): a mismatch is a GoldenFileError, which the worker passes to
  // the parent as the run's input error (exit 2), never a record.
  PreparedCase from_golden(const CaseSpec& spec, const ExecOptions& exec, Case* previous) {
    const std::string id = spec.id();
    require_case(id);
    Case c = regenerate(spec, previous);
    if (last_auto && last_auto->inputs != inputs_key(spec)) last_auto.reset();
    const CaseHeader h = reader->header(id);
    check_regenerated(c, h);
    PreparedCase pc;
    pc.c = std::move(c);
    if (spec.merge.active()) {
      // A merge case's stored inputs must be the regenerated ones, bit for bit.
      PreparedCase stored = reader->load_case(id);
      const MergeInputs &a = *pc.c.merge, &b = *stored.c.merge;
      const std::pair<const Tensor*, const Tensor*> pairs[] = {{&a.prefix_output, &b.prefix_output},
                                                               {&a.prefix_lse, &b.prefix_lse},
                                                               {&a.suffix_output, &b.suffix_output},
                                                               {&a.suffix_lse, &b.suffix_lse}};
      for (const auto& [x, y] : pairs)
        if (x->nbytes() != y->nbytes() || std::memcmp(x->bytes(), y->bytes(), x->nbytes()) != 0)
          throw GoldenFileError(reader->path() + ": " + id +
                                ": the regenerated merge inputs differ from the stored ones (another generator version?)");
      pc.merge = std::move(stored.merge);
      return pc;
    }
    if (pc.c.sparse) pc.sparse = reader->load_sparse(id, pc.c);
    else pc.reference = reader->load_reference(id);
    // A kv=auto case's output reference is the next fp8 cases' unquantized one.
    if (pc.reference && spec.kv_cache_dtype == KvCacheDtype::kAuto)
      last_auto = AutoReference{id, inputs_key(spec), pc.reference->out};
    pc.decode = reader->load_decode_reference(id);
    pc.baselines = reader->load_baselines(id);
    load_unquantized(spec, h, pc);
    for (int bs : h.cache_block_sizes) {
      const StoredCacheOptions so = stored_cache_options(id, bs, exec);
      CacheOptions co;
      co.poison = exec.poison;
      co.poison_block_table = exec.poison_block_table;
      co.write_new_tokens = false;
      co.spare_blocks = so.spare_blocks;
      const std::string key = cache_values_key(spec) + "/bs=" + std::to_string(bs) + "/" + std::string(poison_name(co.poison)) +
                              (co.poison_block_table ? "+table" : "") + "/spare=" + std::to_string(co.spare_blocks);
      PagedCache built = build_paged_cache(pc.c, bs, co);
      const std::array<ContentHash, 3> stored = {so.hash_data, so.hash_block_table, so.hash_slot_mapping};
      const auto seen = checked_caches.find(key);
      if (seen == checked_caches.end() || seen->second != stored) {
        const std::pair<const char*, TensorView> parts[3] = {
            {"data", built.data.view()}, {"block_table", built.block_table.view()}, {"slot_mapping", built.slot_mapping.view()}};
        for (int i = 0; i < 3; ++i) {
          const ContentHash hh = ContentHash::of(stored[static_cast<std::size_t>(i)].kind, parts[i].second.data,
                                                 parts[i].second.nbytes());
          if (hh != stored[static_cast<std::size_t>(i)])
            throw GoldenFileError("case " + id + ": rebuilt cache bs=" + std::to_string(bs) + " " + parts[i].first + " (" +
                                  hh.str() + ") differs from the golden file's (" + hash_hex(stored[static_cast<std::size_t>(i)].value) +
                                  "): the cache layout changed since " + opt.golden + " was exported");
        }
        checked_caches[key] = stored;
      }
      pc.caches.emplace(bs, std::move(built));
    }
    return pc;
  }
};

GoldenRun::GoldenRun(const GoldenRunOptions& opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = opt;
  if (!opt.golden.empty() && !opt.replay.empty()) throw InputError("--golden and replay exclude each other");
  const std::string& source = opt.golden.empty() ? opt.replay : opt.golden;
  if (!source.empty()) {
    m.reader.emplace(source, opt.max_bytes);
    if (m.reader->info().kind != FileKind::kGolden)
      throw GoldenFileError(source + ": a results file holds no inputs or references (use its golden file)");
    if (!opt.golden.empty() && m.reader->info().generator_version != gen::kGeneratorVersion)
      throw GoldenFileError(source + ": exported with generator version " + std::to_string(m.reader->info().generator_version) +
                            ", this mlagate generates version " + std::to_string(gen::kGeneratorVersion) +
                            ": regenerated inputs cannot match (replay it, or export it again)");
    for (const std::string& id : opt.case_ids)
      if (!m.reader->has_case(id)) throw GoldenFileError(source + ": no case '" + id + "' in this file");
  }
  if (!opt.save_results.empty()) {
    if (!source.empty() && same_file(source, opt.save_results))
      throw InputError("--save-results " + opt.save_results + " would replace the golden file being read");
    m.writer.emplace(opt.save_results, opt.command_line, opt.shard);
  }
}

GoldenRun::~GoldenRun() = default;

std::vector<CaseSpec> GoldenRun::file_cases(const std::string& filter) const {
  const Impl& m = *impl_;
  if (!m.reader) throw std::logic_error("GoldenRun::file_cases without a file");
  std::optional<std::regex> re;
  if (!filter.empty()) {
    try {
      re.emplace(filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw InputError("--filter: invalid regex '" + filter + "': " + e.what());
    }
  }
  std::vector<CaseSpec> out;
  for (const std::string& id : m.reader->case_ids()) {
    if (!m.opt.case_ids.empty() && std::find(m.opt.case_ids.begin(), m.opt.case_ids.end(), id) == m.opt.case_ids.end())
      continue;
    if (re && !std::regex_search(id, *re)) continue;
    out.push_back(const_cast<GoldenReader&>(*m.reader).header(id).spec);
  }
  if (out.empty()) throw InputError("the selection matches no case of " + m.reader->path());
  return out;
}

void GoldenRun::validate(const std::vector<CaseSpec>& cases, const ExecOptions& exec) {
  Impl& m = *impl_;
  if (!m.reader) return;
  m.reader->validate_all(m.opt.golden.empty() ? GoldenReader::ValidateScope::kEverything
                                               : GoldenReader::ValidateScope::kReferences);
  if (m.opt.golden.empty()) return;
  // run --golden: what can be refused without making a case (a case missing
  // from the file, a stored cache built with other poison options) is refused
  // here, before any worker starts. Regenerated inputs and rebuilt caches are
  // checked against the file's hashes where they are made (from_golden, in
  // the workers): the parent generating every case too doubled that work.
  for (const CaseSpec& spec : cases) {
    const std::string id = spec.id();
    m.require_case(id);
    for (int bs : m.reader->header(id).cache_block_sizes) m.stored_cache_options(id, bs, exec);
  }
  m.validated = true;
}

void GoldenRun::attach(RunConfig& cfg) {
  Impl* m = impl_.get();
  m->policy = cfg.policy;
  for (const CaseSpec& s : cfg.cases) m->specs.emplace(s.id(), s);
  const ExecOptions exec = cfg.exec;
  if (!m->opt.golden.empty() && !m->writer) {
    // fp8 and fp8_e4m3 cases of one input set hold the same cache values, so
    // export stored the same references for both; when the file's are equal
    // (their stored content hashes, which validate() checked against the
    // content), the run shares the case's context (caches, glue,
    // up-projection) as a generated run does.
    cfg.prepared_same = [m](const CaseSpec& prev, const CaseSpec& next) {
      const std::string a = prev.id(), b = next.id();
      if (!(m->validated || m->opt.validated_by_parent)) return false;
      if (!m->reader->has_case(a) || !m->reader->has_case(b)) return false;
      const CaseHeader ha = m->reader->header(a), hb = m->reader->header(b);
      if (ha.hashes != hb.hashes || ha.cache_block_sizes != hb.cache_block_sizes || ha.spec.sparse.active() ||
          ha.spec.merge.active())
        return false;
      // The handed-on context's caches were checked against a's stored ones:
      // b's must be the same bytes (their hashes) to be checked too.
      for (int bs : ha.cache_block_sizes) {
        const StoredCacheOptions ca = m->reader->cache_options(a, bs), cb = m->reader->cache_options(b, bs);
        if (ca.hash_data != cb.hash_data || ca.hash_block_table != cb.hash_block_table ||
            ca.hash_slot_mapping != cb.hash_slot_mapping || ca.poison != cb.poison ||
            ca.poison_block_table != cb.poison_block_table || ca.spare_blocks != cb.spare_blocks)
          return false;
      }
      return m->reader->stored_reference_hashes(a) == m->reader->stored_reference_hashes(b);
    };
  }
  cfg.prepare = [m, exec](const CaseSpec& spec, Case* previous) {
    PreparedCase pc;
    if (!m->opt.replay.empty()) pc = m->reader->load_case(spec.id());
    else if (!m->opt.golden.empty()) pc = m->from_golden(spec, exec, previous);
    else pc.c = generate_case(spec);
    if (m->writer) m->writer->add_case(spec, &pc.c, m->policy);
    return pc;
  };
  if (!m->writer) return;
  cfg.on_outputs = [m](const Case&, const Record& r, std::span<const ProducedOutput> outputs) {
    std::vector<ResultsWriter::Output> views;
    views.reserve(outputs.size());
    for (const ProducedOutput& po : outputs) views.push_back({po.name, po.buf.view()});
    m->writer->add_record(r, views);
  };
  auto prev = std::move(cfg.on_record);
  cfg.on_record = [m, prev](const Record& r, std::size_t done, std::size_t total) {
    if (!m->writer->has_record(r)) {
      // Records that produced no outputs (not supported, crashed, invalid case).
      if (auto it = m->specs.find(r.case_id); it != m->specs.end()) m->writer->add_case(it->second, nullptr, m->policy);
      m->writer->add_record(r, {});
    }
    if (prev) prev(r, done, total);
  };
}

std::string GoldenRun::finish() {
  if (!impl_->writer) return {};
  impl_->writer->commit();
  return impl_->opt.save_results;
}

}  // namespace mlagate
