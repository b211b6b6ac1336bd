// The layer op's glue cache: entries keyed by their input bytes, lent to
// backends and checked on return, kept within a byte budget.
#include "harness/run/ops/layer/memo.h"

#include <algorithm>
#include <cstring>

#include "harness/run/core_share.h"
#include "harness/run/ops/op_run.h"
#include "reference/glue.h"

namespace mlagate {

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

// A memo entry's key: its latent and rope rows' prints. fingerprint(): a long
// context's megabytes on every thread, where std::hash would take one.
std::size_t input_hash(const Tensor& kv, const Tensor& pe) {
  return fingerprint(kv) ^ (fingerprint(pe) * 0x9e3779b97f4a7c15ull);
}

// The entry of `entries` (Projection or DeviceProjection) made from exactly
// these input bytes, or null.
template <class Entries>
auto* find_entry(const Entries& entries, std::size_t h, const Tensor& kv, const Tensor& pe) {
  for (const auto& p : entries)
    if (p->hash == h && same_bytes(p->kv, kv) && same_bytes(p->pe, pe)) return p.get();
  return static_cast<decltype(entries.front().get())>(nullptr);
}

}  // namespace

std::pair<const Tensor*, const Tensor*> LayerMemo::up_project(const Case& c, const Tensor& kv, const Tensor& pe,
                                                              std::span<const std::int64_t> rows, KvProjection* known) {
  const std::size_t h = input_hash(kv, pe);
  if (const auto* p = find_entry(projections_, h, kv, pe)) return {p->k.get(), p->v.get()};
  spare_.reset();  // valid until this call only: its memory serves the new one
  take_spare_cores();
  auto p = std::make_unique<Projection>();
  p->hash = h;
  p->k = std::make_shared<Tensor>();
  p->v = std::make_shared<Tensor>();
  if (known) {
    up_project_kv_known(c, kv.view(), pe.view(), rows, *known, *p->k, *p->v);
  } else {
    up_project_kv(c, kv.view(), pe.view(), *p->k, *p->v);
  }
  // Rows the case's projection takes from here are held there whatever the
  // memo does, so such an entry is kept past the byte limit (no memory is
  // saved by dropping it) and always fingerprinted: a backend writing into it
  // must not leave damaged rows behind for the baseline.
  const bool offered = known && known->offer(kv.view(), pe.view(), rows, p->k, p->v) > 0;
  const std::size_t size = kv.nbytes() + pe.nbytes() + (offered ? 0 : p->k->nbytes() + p->v->nbytes());
  if (bytes_ + size > kMaxBytes && !offered) {
    spare_ = std::move(p);
    return {spare_->k.get(), spare_->v.get()};
  }
  p->kv = kv;
  p->pe = pe;
  // Fingerprinted when first lent in host memory (lending()): an entry lent
  // only on the device never needs its prints (2.7 GB of reads at TP 1).
  p->offered_to = offered ? known : nullptr;
  bytes_ += size;
  projections_.push_back(std::move(p));
  return {projections_.back()->k.get(), projections_.back()->v.get()};
}

void LayerMemo::lending(const Tensor* k, const Tensor* v) {
  for (const auto& entry : projections_) {
    Projection& p = *entry;
    if (p.k.get() != k || p.v.get() != v) continue;
    if (!p.printed) {
      p.k_print = fingerprint(*p.k);
      p.v_print = fingerprint(*p.v);
      p.printed = true;
    }
    return;
  }
}

void LayerMemo::returned(const Tensor* k, const Tensor* v) {
  for (auto it = projections_.begin(); it != projections_.end(); ++it) {
    Projection& p = **it;
    if (p.k.get() != k || p.v.get() != v) continue;
    if (!p.printed) throw std::logic_error("LayerMemo::returned: K and V lent in host memory without lending()");
    if (fingerprint(*p.k) != p.k_print || fingerprint(*p.v) != p.v_print) {
      if (p.offered_to) p.offered_to->withdraw(p.k.get());
      bytes_ -= p.kv.nbytes() + p.pe.nbytes() + (p.offered_to ? 0 : p.k->nbytes() + p.v->nbytes());
      if (p.device_k) device_bytes_ -= p.k->nbytes() + p.v->nbytes();
      projections_.erase(it);
    }
    return;
  }
  // spare_: not kept and not offered, nothing to check.
}

PagedCache& LayerMemo::cache_copy(const PagedCache& base) {
  cache_ = base;  // Tensor's assignment: the storage reused, the bytes copied on every thread
  return cache_;
}

std::pair<void*, void*> LayerMemo::on_device(const DeviceStaging& s, const Tensor* k, const Tensor* v) {
  for (const auto& entry : projections_) {
    Projection& p = *entry;
    if (p.k.get() != k || p.v.get() != v) continue;
    const std::size_t size = k->nbytes() + v->nbytes();
    if (!p.device_k && device_bytes_ + size <= kMaxDeviceBytes) {
      std::shared_ptr<void> dk = s.upload(k->bytes(), k->nbytes());
      p.device_v = s.upload(v->bytes(), v->nbytes());
      p.device_k = std::move(dk);
      device_bytes_ += size;
    }
    if (p.device_k)
      return {s.to_scratch(0, p.device_k.get(), k->nbytes(), true), s.to_scratch(1, p.device_v.get(), v->nbytes(), true)};
    break;
  }
  // Not kept (spare_, or past the device limit): straight from the host.
  return {s.to_scratch(0, k->bytes(), k->nbytes(), false), s.to_scratch(1, v->bytes(), v->nbytes(), false)};
}

std::pair<void*, void*> LayerMemo::project_on_device(const DeviceStaging& s, const Case& c, const Tensor& kv,
                                                     const Tensor& pe) {
  if (!s.project) throw std::logic_error("LayerMemo::project_on_device: the staging has no projector");
  const std::size_t h = input_hash(kv, pe);
  DeviceProjection* hit = find_entry(device_projections_, h, kv, pe);
  if (!hit) {
    spare_device_.reset();  // valid until this call only: its device memory serves the new one
    auto p = std::make_unique<DeviceProjection>();
    p->hash = h;
    std::tie(p->k, p->v) = s.project(c, kv.view(), pe.view());
    const Dims& d = c.spec.dims;
    const auto rows = static_cast<std::size_t>(kv.dim(0)), N = static_cast<std::size_t>(c.spec.num_heads());
    p->k_bytes = rows * N * static_cast<std::size_t>(d.nope_dim + d.rope_dim) * 2;
    p->v_bytes = rows * N * static_cast<std::size_t>(d.v_head_dim) * 2;
    if (device_bytes_ + p->k_bytes + p->v_bytes > kMaxDeviceBytes) {
      spare_device_ = std::move(p);
      hit = spare_device_.get();
    } else {
      p->kv = kv;
      p->pe = pe;
      bytes_ += kv.nbytes() + pe.nbytes();
      device_bytes_ += p->k_bytes + p->v_bytes;
      device_projections_.push_back(std::move(p));
      hit = device_projections_.back().get();
    }
  }
  // Scratch copies: a backend writing into what it is lent reaches no one.
  return {s.to_scratch(0, hit->k.get(), hit->k_bytes, true), s.to_scratch(1, hit->v.get(), hit->v_bytes, true)};
}

std::pair<const Tensor*, const Tensor*> LayerMemo::absorb(const Case& c, const std::vector<int>& tokens) {
  for (const auto& a : absorbed_)
    if (a->tokens == tokens) return {&a->q_lat, &a->q_pe};
  auto a = std::make_unique<Absorbed>();
  a->tokens = tokens;
  absorb_queries(c, tokens, a->q_lat, a->q_pe);
  const std::size_t size = a->q_lat.nbytes() + a->q_pe.nbytes();
  if (bytes_ + size > kMaxBytes) {
    spare_absorbed_ = std::move(a);
    return {&spare_absorbed_->q_lat, &spare_absorbed_->q_pe};
  }
  bytes_ += size;
  absorbed_.push_back(std::move(a));
  return {&absorbed_.back()->q_lat, &absorbed_.back()->q_pe};
}

KvProjection& LayerMemo::projection(const Case& c) {
  if (!projection_) projection_.emplace(c);
  return *projection_;
}

}  // namespace mlagate
