// The layer op's cache of backend-independent glue (LayerMemo): the prefill
// path's up-projected keys and values, the decode path's absorbed queries,
// the case's own projected rows (KvProjection) and the per-backend cache
// copy. One type, owned by the layer module's state (layer.h), that the
// prefill op and the baseline emulation reach through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cases/case.h"
#include "cases/paged_cache.h"
#include "reference/device_staging.h"
#include "reference/kv_projection.h"

namespace mlagate {

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
  // The case's own rows (KvProjection), owned here and shared with the
  // baseline emulation and the prefill op: made on first use for `c`, which
  // must outlive the memo. projection() without a case: null until made.
  KvProjection& projection(const Case& c);
  KvProjection* projection() { return projection_ ? &*projection_ : nullptr; }
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
  std::optional<KvProjection> projection_;
  PagedCache cache_;  // cache_copy()'s
};

}  // namespace mlagate
