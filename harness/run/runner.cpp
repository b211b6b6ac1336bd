// Runs every (case, backend, op), times each phase, compares against the
// golden and turns every outcome (including exceptions) into a record.
#include "harness/run/runner.h"

#include <array>
#include <chrono>
#include <cmath>
#include <exception>
#include <future>
#include <map>
#include <optional>
#include <system_error>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/sparse.h"
#include "harness/run/cache_write.h"
#include "reference/glue.h"
#include "reports/profile.h"
#include "harness/run/sparse_op.h"
#include "reference/sparse_reference.h"
#include "reference/fp64_reference.h"

namespace mlagate {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct BaselineErrors {
  double out = kNaN, lse = kNaN;
};
}  // namespace

// Everything derived from one case, computed on first use and shared by backends.
struct CaseContext {
  Case c;
  std::optional<ReferenceOutputs> ref_outputs;  // absorbed path: out, lse, o_lat
  // Shared work's milliseconds, accumulated as it happens and handed to the
  // next record run on this context (take_shared): each counted once.
  double enter_ms = 0;     // CaseStream::enter: generating or retargeting the case (also in generate_ms)
  double generate_ms = 0;  // inputs: the case, the prefill op's up-projected keys and values
  double reference_ms = 0;    // fp64 references
  double baseline_ms = 0;  // err_baseline
  Timings taken;           // what earlier records already took
  // Moves the shared work not yet reported into `t`; returns the enter time among it.
  double take_shared(Timings& t) {
    t.generate_ms += generate_ms - taken.generate_ms;
    t.reference_ms += reference_ms - taken.reference_ms;
    t.baseline_ms += baseline_ms - taken.baseline_ms;
    const double entered = enter_ms - taken.total_ms;
    taken.generate_ms = generate_ms;
    taken.reference_ms = reference_ms;
    taken.baseline_ms = baseline_ms;
    taken.total_ms = enter_ms;
    return entered;
  }
  // Kernel-level decode: absorbed queries and the reference on exactly them.
  std::optional<Tensor> q_lat, q_pe;
  std::vector<double> mqa_o_lat, mqa_lse;
  // Up-projected keys and values of the case's own kv rows, request by request
  // as needed: the kernel-level prefill op's inputs (every request), the
  // baseline emulation's prefill form and the layer glue's known rows.
  std::optional<KvProjection> kv_projection;
  CaseContext() {
    layer_memo.set_projection([this]() -> KvProjection& { return shared_projection(); });
  }
  CaseContext(const CaseContext&) = delete;  // the memo's source points here
  CaseContext& operator=(const CaseContext&) = delete;
  // Made and filled on demand, counted with the inputs (generate) except
  // where the layer glue projects rows for a backend and offers them.
  KvProjection& shared_projection() {
    if (!kv_projection) {
      const auto t0 = Clock::now();
      kv_projection.emplace(c);
      generate_ms += ms_since(t0);
    }
    return *kv_projection;
  }
  const KvProjection& projection(std::span<const int> requests) {
    KvProjection& p = shared_projection();
    const auto t0 = Clock::now();
    p.ensure(requests);
    generate_ms += ms_since(t0);
    return p;
  }
  // The kernel-level prefill op's K and V of every row.
  std::pair<const Tensor*, const Tensor*> projection_of_all() {
    KvProjection& p = shared_projection();
    const auto t0 = Clock::now();
    const Tensor* k = &p.k_all();
    const Tensor* v = &p.v_all();
    generate_ms += ms_since(t0);
    return {k, v};
  }
  std::map<std::pair<int, bool>, PagedCache> caches;  // (block size, new tokens written)
  LayerMemo layer_memo;  // the layer op's backend-independent glue, shared by its backends
  const ReferenceImpl* reference = nullptr;            // null or empty members: the Eigen reference
  // fp8 caches: the references over the unquantized inputs, for the
  // quantization error each record reports for information.
  std::optional<ReferenceOutputs> unquantized;
  std::optional<std::vector<double>> unquantized_mqa;  // decode op's o_lat
  // The quant_error metrics by op and output (quantization_metrics). A context
  // handed on to a case of equal cache values keeps them: the same references.
  std::map<std::string, Metrics> quant_metrics;
  // From a PreparedCase: caches without the new tokens, by block size.
  std::map<int, PagedCache> given_caches;
  bool build_missing_caches = true;
  // The baseline policy's err_baseline (SPEC: Pass rules, rule 5): the max abs error of the
  // model-dtype SDPA reference against the reference, for the layer op per form
  // (decode, prefill) and request (NaN until a backend routes it that way), and
  // for each kernel-level op.
  std::array<std::vector<double>, 2> base_out, base_lse;
  std::optional<BaselineErrors> base_decode_op, base_prefill_op;
  // Sparse ops: the query, the fp64 reference on it, V4's compressed caches
  // (by block size) and the model-dtype emulation's errors.
  std::optional<Tensor> sparse_q;
  SparseReference sparse_ref;
  std::map<int, PagedCache> extra_caches;
  std::optional<BaselineErrors> base_sparse;

  void adopt(PreparedCase&& p) {
    c = std::move(p.c);
    ref_outputs = std::move(p.reference);
    if (p.decode) {
      q_lat = std::move(p.decode->q_lat);
      q_pe = std::move(p.decode->q_pe);
      mqa_o_lat = std::move(p.decode->o_lat);
      mqa_lse = std::move(p.decode->lse);
    }
    if (p.sparse) {
      sparse_q = std::move(p.sparse->q);
      sparse_ref.o = std::move(p.sparse->o);
      sparse_ref.lse = std::move(p.sparse->lse);
    }
    given_caches = std::move(p.caches);
    build_missing_caches = p.build_missing_caches;
    if (p.unquantized) unquantized = ReferenceOutputs{std::move(*p.unquantized), {}, {}};
    if (p.unquantized_mqa) unquantized_mqa = std::move(*p.unquantized_mqa);
    if (p.baselines) {
      StoredBaselines& b = *p.baselines;
      if (b.decode_op) base_decode_op = BaselineErrors{(*b.decode_op)[0], (*b.decode_op)[1]};
      if (b.prefill_op) base_prefill_op = BaselineErrors{(*b.prefill_op)[0], (*b.prefill_op)[1]};
      if (b.sparse) base_sparse = BaselineErrors{(*b.sparse)[0], (*b.sparse)[1]};
      stored_layer_base = std::move(b);
    }
  }
  // A golden file's stored err_baseline parts of the layer op (the emulation's:
  // used unless a replacement implementation computes them).
  std::optional<StoredBaselines> stored_layer_base;
  // Empty when a cache of this block size can be had, else why not.
  std::string missing_cache(int bs) const {
    if (build_missing_caches || given_caches.count(bs)) return {};
    std::string have;
    for (const auto& [b, unused] : given_caches) have += (have.empty() ? "" : ", ") + std::to_string(b);
    return "no stored cache for block size " + std::to_string(bs) + " (the file holds " +
           (have.empty() ? std::string("none") : have) + ")";
  }

  const ReferenceOutputs& get_reference() {
    if (!ref_outputs) {
      const auto t0 = Clock::now();
      ref_outputs = reference && reference->absorbed ? reference->absorbed(c) : reference_absorbed(c);
      reference_ms += ms_since(t0);
    }
    return *ref_outputs;
  }
  const PagedCache& cache(int bs, bool write_new, const ExecOptions& opt, double& ms) {
    auto key = std::make_pair(bs, write_new);
    auto it = caches.find(key);
    if (it == caches.end()) {
      const auto t0 = Clock::now();
      CacheOptions co;
      co.poison = opt.poison;
      co.poison_block_table = opt.poison_block_table;
      co.write_new_tokens = write_new;
      if (auto g = given_caches.find(bs); g != given_caches.end()) {
        // A given cache (golden file): the new tokens go in through the reference writer.
        PagedCache pc = g->second;
        if (write_new) write_new_tokens(pc);
        it = caches.emplace(key, std::move(pc)).first;
      } else {
        it = caches.emplace(key, build_paged_cache(c, bs, co)).first;
      }
      ms += ms_since(t0);
    }
    return it->second;
  }
  void write_new_tokens(PagedCache& pc) const {
    const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
    const std::size_t esz = dtype_size(c.kv_c.dtype());
    const std::int64_t* sm = pc.slot_mapping.data<std::int64_t>();
    for (int i = 0; i < c.num_requests; ++i) {
      const int q = c.query_lens[static_cast<std::size_t>(i)];
      if (c.seq_lens[static_cast<std::size_t>(i)] == 0 || q == 0) continue;
      const std::int64_t row = c.kv_start_loc[static_cast<std::size_t>(i)] + c.context_lens[static_cast<std::size_t>(i)];
      TensorView kv{c.kv_c.dtype(), {q, L}, const_cast<std::byte*>(c.kv_c.bytes()) + row * L * esz};
      TensorView pe{c.k_pe.dtype(), {q, R}, const_cast<std::byte*>(c.k_pe.bytes()) + row * R * esz};
      reference_cache_write(pc, kv, pe, {sm + c.query_start_loc[static_cast<std::size_t>(i)], static_cast<std::size_t>(q)});
    }
  }
  void prepare_decode() {
    if (q_lat) return;
    const auto t0 = Clock::now();
    std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
    for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
    q_lat.emplace();
    q_pe.emplace();
    absorb_queries(c, tokens, *q_lat, *q_pe);
    if (reference && reference->mqa)
      reference->mqa(c, q_lat->view(), mqa_o_lat, mqa_lse);
    else
      reference_mqa(c, q_lat->view(), mqa_o_lat, mqa_lse);
    reference_ms += ms_since(t0);
  }
  void prepare_sparse() {
    if (sparse_q) return;
    const auto t0 = Clock::now();
    std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
    for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
    Tensor ql, qp;
    absorb_queries(c, tokens, ql, qp);
    sparse_q = sparse_query(c, ql.view());
    sparse_ref = sparse_golden(c, sparse_q->view());
    reference_ms += ms_since(t0);
  }
  // V4's compressed cache for a block size (nullptr for cases without one).
  const PagedCache* extra_cache(int bs, const ExecOptions& opt, double& ms) {
    if (!c.sparse || c.sparse->extra.empty()) return nullptr;
    auto it = extra_caches.find(bs);
    if (it == extra_caches.end()) {
      const auto t0 = Clock::now();
      CacheOptions co;
      co.poison = opt.poison;
      co.poison_block_table = opt.poison_block_table;
      it = extra_caches.emplace(bs, build_paged_cache(c.sparse->compressed, bs, co)).first;
      ms += ms_since(t0);
    }
    return &it->second;
  }
  BaselineErrors sparse_baseline() {
    if (!base_sparse) {
      prepare_sparse();
      const auto t0 = Clock::now();
      const SparseReference e = sparse_emulation(c, sparse_q->view());
      base_sparse = BaselineErrors{baseline_error(e.o, sparse_ref.o, 0, e.o.size()),
                                   baseline_error(e.lse, sparse_ref.lse, 0, e.lse.size())};
      baseline_ms += ms_since(t0);
    }
    return *base_sparse;
  }

  // The (form, request) pairs of the layer op's err_baseline that `paths`
  // need and that are not known yet, by form (decode, prefill).
  std::array<std::vector<int>, 2> layer_baseline_missing(const std::vector<std::string>& paths,
                                                        const BaselineImpl& impl) {
    const auto B = static_cast<std::size_t>(c.num_requests);
    if (paths.size() != B)
      throw std::logic_error("layer_baseline: " + std::to_string(paths.size()) + " paths for " + std::to_string(B) +
                             " requests");
    std::array<std::vector<int>, 2> need;
    for (int f = 0; f < 2; ++f) {
      const SdpaForm form = f == 0 ? SdpaForm::kDecode : SdpaForm::kPrefill;
      std::vector<double>& eo = base_out[f];
      std::vector<double>& el = base_lse[f];
      if (eo.empty()) {
        eo.assign(B, kNaN), el.assign(B, kNaN);
        // Stored values (NaN: not stored) for the emulation; what is missing is computed.
        if (stored_layer_base && !impl.layer) {
          eo = stored_layer_base->layer_out[f];
          el = stored_layer_base->layer_lse[f];
        }
      }
      for (std::size_t i = 0; i < B; ++i)
        if (paths[i] == sdpa_form_name(form) && std::isnan(eo[i])) need[f].push_back(static_cast<int>(i));
    }
    return need;
  }
  // The model-dtype SDPA of `need` in one form: the emulation or its replacement.
  SdpaResult layer_emulation(SdpaForm form, const std::vector<int>& need, const BaselineImpl& impl) {
    // The prefill form's keys and values: the projection the glue shares (its
    // time counted as generate, not baseline).
    auto emulate = [&] {
      const auto t1 = Clock::now();
      const KvProjection* kv = form == SdpaForm::kPrefill ? &projection(need) : nullptr;
      baseline_ms -= ms_since(t1);
      return emulate_sdpa_layer(c, form, need, kv);
    };
    SdpaResult e = impl.layer ? impl.layer(c, form, need) : emulate();
    // A replacement without lse (SDPA returns none): lse from the emulation.
    if (e.lse.empty()) e.lse = emulate().lse;
    return e;
  }
  // Emulations made ahead (overlap_reference_and_baseline) for exactly these requests.
  std::array<std::optional<std::pair<std::vector<int>, SdpaResult>>, 2> early_emulation;

  // With a reference on the device not yet computed and the emulation's
  // err_baseline about to be needed, the reference runs on another thread
  // while this one emulates: the GPU's fp64 work and the CPU's model-dtype
  // work overlap instead of following each other. The results are the same
  // bits either way (neither reads the other); the reference phase counts
  // only the time spent waiting for it after the emulation. An emulation that
  // throws here is dropped and made again in layer_baseline, where its
  // exception is reported as before; the reference's exception is thrown here,
  // where get_reference would have thrown it. The thread's current device is
  // the process's first visible one (--devices gives each worker its device
  // through CUDA_VISIBLE_DEVICES); the reference uploads its inputs from the
  // host, so the device that computes it does not change its bits.
  void overlap_reference_and_baseline(const std::vector<std::string>& paths, const BaselineImpl& impl) {
    early_emulation = {};
    if (ref_outputs || !reference || !reference->on_device || !reference->absorbed || impl.layer) return;
    std::array<std::vector<int>, 2> need;
    try {
      need = layer_baseline_missing(paths, impl);
    } catch (...) {
      return;  // thrown again where layer_baseline asks, as before
    }
    if (need[0].empty() && need[1].empty()) return;
    std::future<ReferenceOutputs> golden;
    try {
      golden = std::async(std::launch::async, [absorbed = reference->absorbed, &cc = c] { return absorbed(cc); });
    } catch (const std::system_error&) {
      return;  // no thread to be had: the two follow each other, as before
    }
    const auto t0 = Clock::now();
    try {
      for (int f = 0; f < 2; ++f)
        if (!need[f].empty())
          early_emulation[f].emplace(need[f], layer_emulation(f == 0 ? SdpaForm::kDecode : SdpaForm::kPrefill,
                                                              need[f], impl));
    } catch (...) {
      early_emulation = {};
    }
    baseline_ms += ms_since(t0);
    const auto t1 = Clock::now();
    try {
      ref_outputs = golden.get();
    } catch (...) {
      reference_ms += ms_since(t1);
      early_emulation = {};  // the record is the reference's failure; nothing will read them
      throw;
    }
    reference_ms += ms_since(t1);
  }

  // err_baseline of the layer op on the given per-request paths; each
  // (form, request) is computed once per case, whichever backend needs it.
  BaselineErrors layer_baseline(const std::vector<std::string>& paths, const BaselineImpl& impl) {
    const ReferenceOutputs& g = get_reference();
    const auto t0 = Clock::now();
    const std::array<std::vector<int>, 2> need = layer_baseline_missing(paths, impl);
    for (int f = 0; f < 2; ++f) {
      if (need[f].empty()) continue;
      const SdpaForm form = f == 0 ? SdpaForm::kDecode : SdpaForm::kPrefill;
      std::optional<SdpaResult> e;
      if (early_emulation[f] && early_emulation[f]->first == need[f]) e = std::move(early_emulation[f]->second);
      early_emulation[f].reset();
      if (!e) e = layer_emulation(form, need[f], impl);
      std::vector<double> got_out, got_lse;
      layer_baseline_errors(c, *e, g.out, g.lse, need[f], got_out, got_lse);
      for (int i : need[f]) base_out[f][i] = got_out[i], base_lse[f][i] = got_lse[i];
    }
    BaselineErrors err{0, 0};
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const int f = paths[i] == sdpa_form_name(SdpaForm::kDecode) ? 0 : 1;
      err.out = std::max(err.out, base_out[f][i]);
      err.lse = std::max(err.lse, base_lse[f][i]);
    }
    baseline_ms += ms_since(t0);
    return err;
  }
  BaselineErrors decode_op_baseline() {
    if (!base_decode_op) {
      prepare_decode();
      const auto t0 = Clock::now();
      const SdpaResult e = emulate_sdpa_decode_op(c, q_lat->view());
      base_decode_op = BaselineErrors{baseline_error(e.out, mqa_o_lat, 0, e.out.size()),
                                      baseline_error(e.lse, mqa_lse, 0, e.lse.size())};
      baseline_ms += ms_since(t0);
    }
    return *base_decode_op;
  }
  BaselineErrors prefill_op_baseline() {
    if (!base_prefill_op) {
      const auto [k, v] = projection_of_all();
      const ReferenceOutputs& g = get_reference();
      const auto t0 = Clock::now();
      const SdpaResult e = emulate_sdpa_prefill_op(c, k->view(), v->view());
      base_prefill_op =
          BaselineErrors{baseline_error(e.out, g.out, 0, e.out.size()), baseline_error(e.lse, g.lse, 0, e.lse.size())};
      baseline_ms += ms_since(t0);
    }
    return *base_prefill_op;
  }

  // The reference output over the unquantized inputs (layer, prefill: out; decode: o_lat).
  const std::vector<double>& unquantized_main(Op op) {
    const auto t0 = Clock::now();
    Tensor kv = std::move(c.kv_c_cache), pe = std::move(c.k_pe_cache);
    c.kv_c_cache = Tensor();
    c.k_pe_cache = Tensor();
    struct Restore {
      CaseContext& ctx;
      Tensor &kv, &pe;
      ~Restore() {
        ctx.c.kv_c_cache = std::move(kv);
        ctx.c.k_pe_cache = std::move(pe);
      }
    } restore{*this, kv, pe};
    if (op == Op::kDecode) {
      if (!unquantized_mqa) {
        std::vector<double> o, l;
        reference_mqa(c, q_lat->view(), o, l);
        unquantized_mqa = std::move(o);
      }
      reference_ms += ms_since(t0);
      return *unquantized_mqa;
    }
    if (!unquantized) unquantized = reference && reference->absorbed ? reference->absorbed(c) : reference_absorbed(c);
    reference_ms += ms_since(t0);
    return unquantized->out;
  }
};

namespace {

// Quantization error of an fp8 cache, for information (never gates): the
// reference over the dequantized cache (what a perfect kernel returns) against
// the reference over the unquantized inputs, as the metrics of "quant_error".
// Every backend's record of a (case, op) carries the same values (neither
// reference depends on the backend): computed once per context and op.
Metrics quantization_metrics(CaseContext& ctx, Op op, const ProducedOutput& main, const std::vector<double>& ref_outputs) {
  const std::string key = std::string(op_name(op)) + "/" + main.name + "/" + shape_str(main.buf.view().shape) + "/" +
                          std::to_string(main.heads) + "/" + std::to_string(main.dim);
  const std::string message = "for information: reference over the dequantized " +
                              kv_cache_format_name(ctx.c.spec.kv_format()) +
                              " cache against the reference over the unquantized inputs (" + main.name + ")";
  if (const auto it = ctx.quant_metrics.find(key); it != ctx.quant_metrics.end()) {
    Metrics m = it->second;
    m.message = message;
    return m;
  }
  const std::vector<double>& unquantized = ctx.unquantized_main(op);
  OutputCheck chk;
  chk.name = "quant_error";
  chk.got = TensorView{DType::kF64, main.buf.view().shape, const_cast<double*>(ref_outputs.data())};
  chk.expected_shape = chk.got.shape;
  chk.expected_dtype = DType::kF64;
  chk.reference = &unquantized;
  chk.layout = Layout{ctx.c.query_start_loc, main.heads, main.dim};
  Metrics m;
  compare_output(chk, make_policy("fixed", INFINITY, 0), m);
  m.passed = true;
  m.message = message;
  ctx.quant_metrics.emplace(key, m);
  return m;
}

}  // namespace

namespace {
Record run_one_untimed(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg);
}  // namespace

// run_one_untimed, with the shared work it triggered (or that earlier
// records on this context left unreported) and its whole time in the record.
Record run_one(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) {
  const auto t0 = Clock::now();
  Record r = run_one_untimed(ctx, b, op, cfg);
  const double wall = ms_since(t0);
  Timings& t = r.timings;
  const double entered = ctx.take_shared(t);
  t.total_ms = wall + entered;
  // The case's generation happened in enter(), outside `wall`; everything else
  // named happened inside it.
  t.glue_ms = std::max(0.0, t.total_ms - (t.generate_ms + t.reference_ms + t.baseline_ms + t.cache_ms + t.run_ms + t.compare_ms));
  run_profile().add_job(t);  // in a worker this process's profile is not shown: the parent adds the record
  return r;
}

namespace {
Record run_one_untimed(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) {
  const Case& c = ctx.c;
  Record r;
  r.case_id = c.spec.id();
  r.backend = std::string(b.name());
  r.op = std::string(op_name(op));
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(c.spec, r.backend, op);

  Support s;
  Capabilities caps;
  try {
    // Out-of-tree backends answer through foreign code: a throw is a record, not the end of the run.
    s = b.supports(c.spec, op);
    caps = b.capabilities();
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("supports() threw: ") + e.what();
    return r;
  }
  if (s.ok && op == Op::kLayer) s = route_requests(caps, c.spec).support;
  if (!s.ok) {
    r.status = Status::kNotSupported;
    r.message = s.reason;
    return r;
  }
  r.block_size = resolve_block_size(caps, c.spec);
  if (const std::string why = op == Op::kPrefill ? std::string() : ctx.missing_cache(r.block_size); !why.empty()) {
    r.status = Status::kSkipped;
    r.message = why;
    return r;
  }

  OpRun run;
  const std::vector<double>* reference_main = nullptr;
  const std::vector<double>* reference_lse = nullptr;
  try {
    switch (op) {
      case Op::kLayer: {
        const PagedCache& base = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
        run = run_layer(b, c, base, cfg.exec, &ctx.layer_memo);
        if (cfg.baseline.always || cfg.policy.kind == Policy::Kind::kBaseline)
          ctx.overlap_reference_and_baseline(run.paths, cfg.baseline);
        reference_main = &ctx.get_reference().out;
        reference_lse = &ctx.get_reference().lse;
        break;
      }
      case Op::kDecode: {
        const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
        ctx.prepare_decode();
        run = run_decode_op(b, c, full, *ctx.q_lat, *ctx.q_pe, cfg.exec);
        reference_main = &ctx.mqa_o_lat;
        reference_lse = &ctx.mqa_lse;
        break;
      }
      case Op::kPrefill: {
        const auto [k, v] = ctx.projection_of_all();
        const std::uint64_t k_print = fingerprint(*k), v_print = fingerprint(*v);
        // Lent, not copied: a backend that wrote into them must not change the
        // next backend's inputs nor the baseline's keys, whether it returned or threw.
        const auto check = [&] {
          if (fingerprint(*k) != k_print || fingerprint(*v) != v_print) ctx.kv_projection->withdraw(k);
        };
        try {
          run = run_prefill_op(b, c, *k, *v, cfg.exec);
        } catch (...) {
          check();
          throw;
        }
        check();
        reference_main = &ctx.get_reference().out;
        reference_lse = &ctx.get_reference().lse;
        break;
      }
      case Op::kSparseDecode:
      case Op::kSparsePrefill: {
        const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
        const PagedCache* extra = ctx.extra_cache(r.block_size, cfg.exec, r.timings.cache_ms);
        ctx.prepare_sparse();
        run = op == Op::kSparseDecode ? run_sparse_decode_op(b, c, full, extra, *ctx.sparse_q, cfg.exec)
                                      : run_sparse_prefill_op(b, c, full, extra, *ctx.sparse_q, cfg.exec);
        reference_main = &ctx.sparse_ref.o;
        reference_lse = &ctx.sparse_ref.lse;
        break;
      }
      case Op::kCacheWrite: {
        // Conformance, bit-exact: the backend's writer against the reference writer.
        const PagedCache& base = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
        const CacheWriteCheck w = check_cache_write(b, c, base);
        r.timings.run_ms = w.run_ms;
        r.status = w.identical ? Status::kPassed : Status::kIncorrect;
        r.message = w.message;
        return r;
      }
    }
  } catch (const NotSupportedError& e) {
    r.status = Status::kNotSupported;
    r.message = e.what();
    return r;
  } catch (const DeviceUnavailableError& e) {
    r.status = Status::kSkipped;
    r.message = e.what();
    return r;
  } catch (const OutOfBoundsWriteError& e) {
    // Found by the backend's own device-side guard bands (SPEC: Pass rules, rule 2).
    r.status = Status::kIncorrect;
    r.message = e.what();
    return r;
  } catch (const WrongOutputError& e) {
    // Found by the backend's own output checks (SPEC: Pass rules, rule 1: shape and dtype).
    r.status = Status::kIncorrect;
    r.message = e.what();
    return r;
  } catch (const BackendTimeoutError& e) {
    r.status = Status::kTimeout;
    r.message = e.what();
    return r;
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("backend threw: ") + e.what();
    return r;
  }
  // err_baseline for the outputs of this op, on the paths the backend took.
  BaselineErrors base;
  if (cfg.baseline.always || cfg.policy.kind == Policy::Kind::kBaseline) {
    switch (op) {
      case Op::kLayer: base = ctx.layer_baseline(run.paths, cfg.baseline); break;
      case Op::kDecode: base = ctx.decode_op_baseline(); break;
      case Op::kPrefill: base = ctx.prefill_op_baseline(); break;
      case Op::kCacheWrite: break;
      case Op::kSparseDecode:
      case Op::kSparsePrefill: base = ctx.sparse_baseline(); break;
    }
  }
  const Dims& dims = c.spec.dims;
  const int dqk = op == Op::kPrefill ? dims.nope_dim + dims.rope_dim : dims.kv_lora_rank + dims.rope_dim;
  r.timings.run_ms = run.run_ms;
  r.paths = run.paths;

  const auto t0 = Clock::now();
  const double reference_before = ctx.reference_ms;  // the fp8 quantization error's reference is golden, not compare
  std::optional<Status> nonfinite, incorrect;
  std::string nonfinite_msg, incorrect_msg, info_msg;
  for (const ProducedOutput& po : run.outputs) {
    OutputCheck chk;
    chk.name = po.name;
    chk.got = po.buf.view();
    chk.expected_shape = po.buf.view().shape;
    chk.expected_dtype = po.buf.view().dtype;
    chk.reference = po.is_lse ? reference_lse : reference_main;
    chk.layout = Layout{c.query_start_loc, po.heads, po.dim};
    chk.is_lse = po.is_lse;
    chk.err_baseline = po.is_lse ? base.lse : base.out;
    chk.dqk = dqk;
    Metrics m;
    const Status st = compare_output(chk, cfg.policy, m);
    if (st == Status::kNonfinite && !nonfinite) nonfinite = st, nonfinite_msg = m.message;
    if (st == Status::kIncorrect && !incorrect) incorrect = st, incorrect_msg = m.message;
    if (st == Status::kPassed && !m.message.empty() && info_msg.empty()) info_msg = m.message;
    r.metrics.push_back(std::move(m));
  }
  // (The sparse ops report no quantization error: their references over the
  // unquantized inputs are not computed.)
  if (is_fp8(c.spec.kv_cache_dtype) && !is_sparse_op(op) && !run.outputs.empty() && reference_main)
    r.metrics.push_back(quantization_metrics(ctx, op, run.outputs.front(), *reference_main));
  r.timings.compare_ms = ms_since(t0) - (ctx.reference_ms - reference_before);
  // SPEC: Pass rules order: guard bands, then non-finite values, then tolerance.
  if (!run.guard_violation.empty()) {
    r.status = Status::kIncorrect;
    r.message = run.guard_violation;
  } else if (nonfinite) {
    r.status = Status::kNonfinite;
    r.message = nonfinite_msg;
  } else if (incorrect) {
    r.status = Status::kIncorrect;
    r.message = incorrect_msg;
  } else {
    r.status = Status::kPassed;
    r.message = info_msg;
  }
  if (cfg.on_outputs) cfg.on_outputs(c, r, run.outputs);
  return r;
}
}  // namespace

const CaseSpec& context_spec(const CaseContext& ctx) { return ctx.c.spec; }

CaseStream::CaseStream(const RunConfig& cfg) : cfg_(cfg) {}
CaseStream::~CaseStream() = default;

// Consecutive cases share what they can (the inputs depend on neither the kv
// cache dtype, its scale rule, k_scale nor the block size):
// - equal cache values (cache_values_key: fp8 and fp8_e4m3 are one format;
//   fp8_ds_mla ignores k_scale): the whole context moves on, golden,
//   references and caches included; only the spec and the caches' dtype tags change;
// - equal inputs (inputs_key): the generated case moves on and is retargeted,
//   and so do the unquantized references (an auto case's golden is exactly
//   that) for the fp8 cases' quantization error.
CaseContext& CaseStream::enter(const CaseSpec& spec) {
  auto ctx = std::make_unique<CaseContext>();
  ctx->reference = &cfg_.reference;
  std::unique_ptr<CaseContext> prev = std::move(last_);
  const auto t0 = Clock::now();
  const bool same_values = prev && cache_values_key(prev->c.spec) == cache_values_key(spec);
  if (cfg_.prepare && !(same_values && cfg_.prepared_same && cfg_.prepared_same(prev->c.spec, spec))) {
    // A prepared case (golden file) is handed on whole only when its
    // references are the same; its inputs whenever they are.
    // The previous context is freed before the next is made (peak memory):
    // only its case's tensors are kept, when they are this one's.
    std::optional<Case> previous;
    if (prev && inputs_key(prev->c.spec) == inputs_key(spec)) previous.emplace(std::move(prev->c));
    prev.reset();
    ctx->adopt(cfg_.prepare(spec, previous ? &*previous : nullptr));
  } else if (same_values) {
    spec.validate();
    ctx = std::move(prev);
    ctx->c.spec = spec;
    auto retag = [&](auto& caches) {
      for (auto& [key, pc] : caches) {
        pc.kv_dtype = spec.kv_cache_dtype;
        pc.k_scale = spec.k_scale;
      }
    };
    retag(ctx->caches);
    retag(ctx->extra_caches);
    retag(ctx->given_caches);
  } else if (prev && inputs_key(prev->c.spec) == inputs_key(spec)) {
    if (!is_fp8(prev->c.spec.kv_cache_dtype)) {
      if (prev->ref_outputs) prev->unquantized = std::move(prev->ref_outputs);
      if (!prev->mqa_o_lat.empty()) prev->unquantized_mqa = std::move(prev->mqa_o_lat);
    }
    ctx->c = std::move(prev->c);
    ctx->unquantized = std::move(prev->unquantized);
    ctx->unquantized_mqa = std::move(prev->unquantized_mqa);
    prev.reset();
    retarget_case(ctx->c, spec);
  } else {
    prev.reset();
    ctx->c = generate_case(spec);
  }
  // A context handed on keeps its counters: what is new is added.
  const double entered = ms_since(t0);
  ctx->enter_ms += entered;
  ctx->generate_ms += entered;
  last_ = std::move(ctx);
  return *last_;
}

Record invalid_case_record(const RunConfig& cfg, const CaseSpec& spec, const std::string& backend, Op op,
                           const std::string& why) {
  Record r;
  r.case_id = spec.id();
  r.backend = backend;
  r.op = std::string(op_name(op));
  r.status = Status::kInvalidCase;
  r.message = why;
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(spec, r.backend, op);
  return r;
}

std::vector<Record> run_cases(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<Record> records;
  const std::size_t total = cfg.cases.size() * backends.size() * cfg.ops.size();
  auto emit = [&](Record r) {
    records.push_back(std::move(r));
    if (cfg.on_record) cfg.on_record(records.back(), records.size(), total);
  };
  CaseStream stream(cfg);
  for (const CaseSpec& spec : cfg.cases) {
    if (cfg.stop && cfg.stop()) break;
    CaseContext* ctx = nullptr;
    try {
      ctx = &stream.enter(spec);
    } catch (const InvalidCase& e) {
      for (auto& b : backends)
        for (Op op : cfg.ops) emit(invalid_case_record(cfg, spec, std::string(b->name()), op, e.what()));
      continue;
    }
    for (auto& b : backends)
      for (Op op : cfg.ops) {
        if (cfg.stop && cfg.stop()) return records;
        emit(cfg.run_job ? cfg.run_job(*ctx, *b, op) : run_one(*ctx, *b, op, cfg));
      }
  }
  return records;
}

}  // namespace mlagate
