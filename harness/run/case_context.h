// What a case's records share: its inputs, references, caches, baseline
// errors and layer glue, computed on first use (CaseContext), and the stream
// of cases that hands them on between consecutive cases (CaseStream, in
// case_context.cpp). Internal to harness/run: runner.h only declares it.
#pragma once

#include <array>
#include <chrono>
#include <cmath>
#include <exception>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/sparse.h"
#include "harness/run/cache_write.h"
#include "reference/glue.h"
#include "reports/profile.h"
#include "harness/run/sparse_op.h"
#include "reference/sparse_reference.h"
#include "reference/merge_reference.h"
#include "reference/fp64_reference.h"
#include "harness/run/layer.h"
#include "harness/run/runner.h"

namespace mlagate {

namespace run_detail {
using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace run_detail

struct BaselineErrors {
  double out = kNaN, lse = kNaN;
};

// Everything derived from one case, computed on first use and shared by backends.
struct CaseContext {
  using Clock = run_detail::Clock;
  static double ms_since(Clock::time_point t0) { return run_detail::ms_since(t0); }

  Case c;
  std::optional<ReferenceOutputs> ref_outputs;  // absorbed path: out, lse, o_lat
  // Shared work's milliseconds, accumulated as it happens and handed to the
  // next record run on this context (take_shared): each counted once.
  // CaseStream::enter: generating or retargeting the case (also in generate_ms);
  // for a case made ahead (CaseAhead), all the work done there.
  double enter_ms = 0;
  double generate_ms = 0;  // inputs: the case, the prefill op's up-projected keys and values
  double reference_ms = 0;    // fp64 references
  double baseline_ms = 0;  // err_baseline
  double cache_ms = 0;     // paged caches made ahead (CaseAhead); a job's own are in its record
  Timings taken;           // what earlier records already took
  // Moves the shared work not yet reported into `t`; returns the enter time among it.
  double take_shared(Timings& t) {
    t.generate_ms += generate_ms - taken.generate_ms;
    t.reference_ms += reference_ms - taken.reference_ms;
    t.baseline_ms += baseline_ms - taken.baseline_ms;
    t.cache_ms += cache_ms - taken.cache_ms;
    const double entered = enter_ms - taken.total_ms;
    taken.generate_ms = generate_ms;
    taken.reference_ms = reference_ms;
    taken.baseline_ms = baseline_ms;
    taken.cache_ms = cache_ms;
    taken.total_ms = enter_ms;
    return entered;
  }
  // A job's record closes: the shared work it triggered (or that earlier
  // records left unreported) taken into `t`, its whole time (`wall_ms` plus the
  // case's generation in enter(), outside it), the glue as the rest, and the
  // run's profile told.
  void close_timings(Timings& t, double wall_ms) {
    t.total_ms = wall_ms + take_shared(t);
    t.glue_ms = std::max(0.0, t.total_ms - (t.generate_ms + t.reference_ms + t.baseline_ms + t.cache_ms + t.run_ms +
                                            t.compare_ms));
    run_profile().add_job(t);  // in a worker this process's profile is not shown: the parent adds the record
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
    if (p.merge) merge_ref = std::move(p.merge);
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
  // The merge_states op: the fp64 reference of a merge case and the fp32
  // merge's error against it (its err_baseline), both from merge_row
  // (reference/merge_reference.h).
  std::optional<MergeReference> merge_ref;
  std::optional<BaselineErrors> base_merge;
  const MergeReference& prepare_merge() {
    if (!merge_ref) {
      const auto t0 = Clock::now();
      merge_ref = reference_merge(*c.merge);
      reference_ms += ms_since(t0);
    }
    return *merge_ref;
  }
  BaselineErrors merge_baseline() {
    if (!base_merge) {
      const MergeReference& r = prepare_merge();
      const auto t0 = Clock::now();
      const MergeReference e = fp32_merge(*c.merge), f = fp32_merge(*c.merge, true);
      base_merge = BaselineErrors{std::max(baseline_error(e.out, r.out, 0, e.out.size()), baseline_error(f.out, r.out, 0, f.out.size())),
                                  std::max(baseline_error(e.lse, r.lse, 0, e.lse.size()), baseline_error(f.lse, r.lse, 0, f.lse.size()))};
      baseline_ms += ms_since(t0);
    }
    return *base_merge;
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
      // An emulator that projects K and V from the latent rows itself needs
      // none projected here (on the GPU: none brought to the host).
      const KvProjection* kv = nullptr;
      if (form == SdpaForm::kPrefill)
        kv = prefill_emulation_reads_latent(c, shared_projection()) ? &shared_projection() : &projection(need);
      baseline_ms -= ms_since(t1);
      return emulate_sdpa_layer(c, form, need, kv);
    };
    SdpaResult e = impl.layer ? impl.layer(c, form, need) : emulate();
    // A replacement without lse (SDPA returns none): lse from the emulation.
    // Nor has it the decode path with fp32 keys on a cache whose rounded keys
    // are inexact (torch's SDPA takes 16-bit keys; sdpa_emulation.h): that
    // implementation's errors come from the emulation too.
    const bool wants_f32_keys = form == SdpaForm::kDecode && !cache_values_exact(c);
    if (e.lse.empty() || (wants_f32_keys && (e.out_f32_keys.empty() || e.lse_f32_keys.empty()))) {
      SdpaResult em = emulate();
      if (e.lse.empty()) e.lse = std::move(em.lse);
      if (e.out_f32_keys.empty()) e.out_f32_keys = std::move(em.out_f32_keys);
      if (e.lse_f32_keys.empty()) e.lse_f32_keys = std::move(em.lse_f32_keys);
    }
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
      base_decode_op = BaselineErrors{baseline_error(e, false, mqa_o_lat, 0, e.out.size()),
                                      baseline_error(e, true, mqa_lse, 0, e.lse.size())};
      baseline_ms += ms_since(t0);
    }
    return *base_decode_op;
  }
  BaselineErrors prefill_op_baseline() {
    if (!base_prefill_op) {
      const auto [k, v] = projection_of_all();
      const ReferenceOutputs& g = get_reference();
      const auto t0 = Clock::now();
      const SdpaResult e = emulate_sdpa_prefill_op(c, k->view(), v->view(), &shared_projection());
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

}  // namespace mlagate
