// Runs one op of one backend on one case: the layer op composed from the
// backend's kernels as vLLM's MLAAttention does (SPEC: Ops), or a
// kernel-level decode / prefill op. Outputs come back in guarded buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "harness/run/guarded.h"
#include "reference/device_staging.h"
#include "reference/glue.h"

namespace mlagate {

struct ExecOptions {
  Poison poison = Poison::kNaN;     // outputs, workspaces and unused cache regions
  bool poison_block_table = false;  // unused block-table entries = an invalid huge id
  int prefill_chunk = 2048;         // context tokens per chunk of the MHA prefill path
  bool reuse_buffers = false;       // kernel outputs from a pool of earlier ones (GuardedBuffer reuse), not fresh
};

// Which requests take the decode path: q_len <= reorder threshold, with
// UNIFORM decodes sharing the first decode's q_len and SINGLE_ONLY decodes
// having q_len 1; spec-decode batches raise the threshold to the longest
// query for backends that are not SINGLE_ONLY (as the seed test does).
struct Routing {
  Support support;
  std::vector<bool> is_decode;  // [B]
  // Each request's path as the layer op's records name it (OpRun::paths).
  std::vector<std::string> paths() const {
    std::vector<std::string> p;
    for (const bool dec : is_decode) p.emplace_back(dec ? "decode" : "prefill");
    return p;
  }
};
Routing route_requests(const Capabilities& caps, const CaseSpec& spec);

struct ProducedOutput {
  std::string name;  // "out", "lse", "o_lat", "o"
  GuardedBuffer buf;
  std::int64_t heads = 1, dim = 1;  // for locating elements
  bool is_lse = false;
};

struct OpRun {
  std::vector<ProducedOutput> outputs;
  std::vector<std::string> paths;  // layer: per request
  std::string guard_violation;     // first out-of-bounds write into a kernel output
  double run_ms = 0;               // time inside the backend's kernels
};

// Records the first guard-band violation of a kernel output buffer in run.
void note_guard(OpRun& run, const GuardedBuffer& buf, const std::string& name);
// The end of a kernel-level op: both outputs' guard bands checked (under the
// outputs' names), each of the case's requests recorded as taking `path`, and
// the outputs moved into run.
void finish_kernel_op(OpRun& run, ProducedOutput& out, ProducedOutput& lse, int num_requests, const char* path);

// The layer op's harness glue that does not depend on the backend, kept for
// the next backend that runs the same case: the prefill path's up-projected
// keys and values (a GEMM per chunk of context, the bulk of the glue) and the
// decode path's absorbed queries. Up-projections are keyed by their input
// bytes and reused only for byte-identical inputs, so a backend whose cache
// writer damaged the context still gets that context's own projection; the
// results are the bits up_project_kv / absorb_queries return.
class LayerMemo {
 public:
  // up_project_kv(c, kv, pe), computed on a miss. The tensors live as long as
  // the memo (one over kMaxBytes: until the next call). They are lent to the
  // backend as they are, not copied (a GB at TP 1): lending() fingerprints
  // them before their first such call, and after each call returned() checks
  // them against the prints and drops an entry the backend wrote into, so
  // that the next backend's K and V are computed afresh.
  // With `known` (from projection()): rows[j] is the case's kv row that row j
  // of kv holds (-1: none), and rows whose latent bits match known's are
  // copied from it, not projected again (the same bits).
  // Rows newly projected here are offered to `known` (KvProjection::offer).
  std::pair<const Tensor*, const Tensor*> up_project(const Case& c, const Tensor& kv, const Tensor& pe,
                                                     std::span<const std::int64_t> rows = {},
                                                     KvProjection* known = nullptr);
  // Before k and v are lent in host memory: their prints (once an entry).
  void lending(const Tensor* k, const Tensor* v);
  void returned(const Tensor* k, const Tensor* v);
  // k and v, as up_project returned them, in device memory for a backend
  // that reads its prefill inputs there (Capabilities::device_inputs), valid
  // until the next call: a kept entry goes to the device once (up to
  // kMaxDeviceBytes of such copies) and every call is lent the staging's
  // scratch copies of it, so a backend writing into them changes nothing
  // the next one gets, and nothing needs a fingerprint afterwards.
  std::pair<void*, void*> on_device(const DeviceStaging& s, const Tensor* k, const Tensor* v);
  // up_project(c, kv, pe)'s K and V made in device memory by the staging's
  // projector (s.project must be set), never in host memory, for a backend
  // that reads its prefill inputs there: an entry per input bytes, kept
  // within kMaxDeviceBytes (beyond, made again per call), and every call lent
  // the staging's scratch copies of it, valid until the next call. Such an
  // entry offers no rows to the case's KvProjection: the baseline emulation
  // on the GPU projects its own from the latent rows (sdpa_emulation.h).
  std::pair<void*, void*> project_on_device(const DeviceStaging& s, const Case& c, const Tensor& kv, const Tensor& pe);
  // A copy of the case's cache for one backend's call (its cache_write writes
  // into it), made in storage kept from the previous backend's: the pages are
  // faulted in once a case, not once a backend. Valid until the next call.
  PagedCache& cache_copy(const PagedCache& base);
  // absorb_queries(c, tokens), computed on a miss.
  std::pair<const Tensor*, const Tensor*> absorb(const Case& c, const std::vector<int>& tokens);
  std::size_t bytes() const { return bytes_; }
  // The case's shared KvProjection (the runner's CaseContext provides it;
  // without one, every miss is projected and nothing is shared).
  using ProjectionSource = std::function<KvProjection&()>;
  void set_projection(ProjectionSource source) { projection_ = std::move(source); }
  KvProjection* projection() const { return projection_ ? &projection_() : nullptr; }
  static constexpr std::size_t kMaxBytes = std::size_t{2} << 30;  // beyond: computed, not kept
  static constexpr std::size_t kMaxDeviceBytes = std::size_t{16} << 30;  // beyond: uploaded per call

 private:
  struct Projection {
    std::size_t hash;
    Tensor kv, pe;
    std::shared_ptr<Tensor> k, v;  // shared with the KvProjection it was offered to
    std::uint64_t k_print = 0, v_print = 0;  // fingerprint() of k and v as computed, once lent on the host
    bool printed = false;
    KvProjection* offered_to = nullptr;      // holds some of its rows
    std::shared_ptr<void> device_k, device_v;  // on_device()'s kept copies
  };
  struct Absorbed {
    std::vector<int> tokens;
    Tensor q_lat, q_pe;
  };
  struct DeviceProjection {
    std::size_t hash;
    Tensor kv, pe;
    std::shared_ptr<void> k, v;
    std::size_t k_bytes = 0, v_bytes = 0;
  };
  std::vector<std::unique_ptr<Projection>> projections_;
  std::vector<std::unique_ptr<DeviceProjection>> device_projections_;
  std::unique_ptr<DeviceProjection> spare_device_;  // past kMaxDeviceBytes: valid until the next call
  std::vector<std::unique_ptr<Absorbed>> absorbed_;
  std::unique_ptr<Projection> spare_;  // a miss over the limit: valid until the next call
  std::unique_ptr<Absorbed> spare_absorbed_;
  std::size_t bytes_ = 0;
  std::size_t device_bytes_ = 0;
  ProjectionSource projection_;
  PagedCache cache_;  // cache_copy()'s
};

// A 64-bit print of a tensor's bytes, to notice a backend that wrote into
// inputs it was lent (fast: a GB in a fraction of a second on 16 cores).
std::uint64_t fingerprint(const Tensor& t);
std::uint64_t fingerprint(const void* data, std::size_t nbytes);  // any bytes (a TensorView's)

// Layer op. base_cache: the case's cache for the backend's block size, built
// with write_new_tokens = false (the backend's cache_write fills them).
// Throws NotSupportedError when the routing needs a kernel the backend lacks.
// memo (optional): glue shared with the other backends running this case.
OpRun run_layer(Backend& b, const Case& c, const PagedCache& base_cache, const ExecOptions& opt,
                LayerMemo* memo = nullptr);
// Kernel-level decode of every request on absorbed queries (q_lat [T,N,L], q_pe [T,N,R]).
// cache: built with write_new_tokens = true.
OpRun run_decode_op(Backend& b, const Case& c, const PagedCache& cache, const Tensor& q_lat, const Tensor& q_pe,
                    const ExecOptions& opt);
// Kernel-level prefill of every request over the up-projected keys (k [S,N,P+R], v [S,N,V]).
OpRun run_prefill_op(Backend& b, const Case& c, const Tensor& k, const Tensor& v, const ExecOptions& opt);

}  // namespace mlagate
