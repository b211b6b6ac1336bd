// The layer op's prefill inputs lent in "device" memory (reference/
// device_staging.h) to backends whose capabilities say they read them there:
// one upload per memo entry whatever the number of backends and calls, every
// call given its own scratch copy (a backend that writes into it reaches no
// one), the same bits as the host path, and host views for every other
// backend. The staging here is a host stand-in that counts its copies.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "cases/suite.h"
#include "harness/run/ops/layer/layer.h"
#include "harness/run/runner.h"
#include "reference/device_staging.h"
#include "reference/glue.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {
namespace {

struct Counts {
  int uploads = 0, from_device = 0, from_host = 0, releases = 0;
};
Counts g_counts;
std::vector<std::byte> g_slot[2];

std::shared_ptr<void> fake_upload(const void* host, std::size_t bytes) {
  ++g_counts.uploads;
  std::shared_ptr<std::byte[]> p(new std::byte[bytes ? bytes : 1]);
  std::memcpy(p.get(), host, bytes);
  return std::shared_ptr<void>(p, p.get());
}
void* fake_to_scratch(int slot, const void* src, std::size_t bytes, bool src_on_device) {
  ++(src_on_device ? g_counts.from_device : g_counts.from_host);
  auto& s = g_slot[slot];
  s.assign(bytes ? bytes : 1, std::byte{0});
  std::memcpy(s.data(), src, bytes);
  return s.data();
}
void fake_release() { ++g_counts.releases; }
const DeviceStaging kFake{fake_upload, fake_to_scratch, fake_release};

// A staging that also projects K and V "on the device" (host memory here)
// with the CPU's row-wise GEMM: the glue's bits, as the GPU's projector.
int g_projections = 0;
std::pair<std::shared_ptr<void>, std::shared_ptr<void>> fake_project(const Case& c, const TensorView& kv,
                                                                     const TensorView& pe) {
  ++g_projections;
  const std::int64_t s = kv.shape.at(0), N = c.spec.num_heads();
  const Dims& d = c.spec.dims;
  auto k = std::make_shared<std::vector<std::uint16_t>>(static_cast<std::size_t>(s * N * (d.nope_dim + d.rope_dim)) + 1);
  auto v = std::make_shared<std::vector<std::uint16_t>>(static_cast<std::size_t>(s * N * d.v_head_dim) + 1);
  const RowRun run{0, s, k->data(), v->data()};
  project_rows_on_cpu(c, kv, pe, {&run, 1});
  return {std::shared_ptr<void>(k, k->data()), std::shared_ptr<void>(v, v->data())};
}
const DeviceStaging kFakeProjecting{fake_upload, fake_to_scratch, fake_release, fake_project};

// A staging whose device memory is always taken.
std::shared_ptr<void> full_upload(const void*, std::size_t) { throw std::runtime_error("out of device memory"); }
void* full_to_scratch(int, const void*, std::size_t, bool) { throw std::runtime_error("out of device memory"); }
const DeviceStaging kFull{full_upload, full_to_scratch, fake_release};
std::pair<std::shared_ptr<void>, std::shared_ptr<void>> full_project(const Case&, const TensorView&, const TensorView&) {
  throw std::runtime_error("out of device memory");
}
const DeviceStaging kFullProjecting{full_upload, full_to_scratch, fake_release, full_project};

// cpu.paged that says it reads prefill inputs on the device (the stand-in's
// "device" is host memory, so it can); it notes what it was lent and may
// scribble over it afterwards.
class OnDevice : public Backend {
 public:
  explicit OnDevice(bool scribble) : scribble_(scribble), inner_(make_cpu_paged()) {}
  std::string_view name() const override { return scribble_ ? "test.device.scribbler" : "test.device"; }
  std::string_view description() const override { return "test backend"; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.device_inputs = true;
    return c;
  }
  void decode(const DecodeArgs& a) override { inner_->decode(a); }
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    inner_->cache_write(cache, kv_c, k_pe, slots);
  }
  void prefill(const PrefillArgs& a) override {
    ++calls;
    if (a.k.on_device && a.v.on_device) ++device_calls;
    if (a.q.on_device || a.o.on_device || a.lse.on_device) ++other_on_device;
    PrefillArgs host = a;
    host.k.on_device = host.v.on_device = false;
    inner_->prefill(host);
    if (scribble_) {
      std::memset(a.k.data, 0x7F, a.k.nbytes());
      std::memset(a.v.data, 0x7F, a.v.nbytes());
    }
  }
  int calls = 0, device_calls = 0, other_on_device = 0;

 private:
  bool scribble_;
  std::unique_ptr<Backend> inner_;
};

// cpu.paged, noting whether it was ever lent device memory.
class HostOnly : public Backend {
 public:
  HostOnly() : inner_(make_cpu_paged()) {}
  std::string_view name() const override { return "cpu.paged"; }
  std::string_view description() const override { return "test backend"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  void decode(const DecodeArgs& a) override { inner_->decode(a); }
  void prefill(const PrefillArgs& a) override {
    ++calls;
    if (a.k.on_device || a.v.on_device) ++device_calls;
    inner_->prefill(a);
  }
  int calls = 0, device_calls = 0;

 private:
  std::unique_ptr<Backend> inner_;
};

RunConfig config() {
  RunConfig cfg;
  CaseSpec s;
  s.batch = find_batch_spec("mixed_small");  // decodes and prefills with context
  s.tp = 16;
  cfg.cases = {s};
  cfg.policy = make_policy("baseline", 0, 0);  // err_baseline in every record
  cfg.exec.prefill_chunk = 16;  // several chunks of context: several memo entries
  return cfg;
}

void expect_same_metrics(const Record& a, const Record& b) {
  SCOPED_TRACE(b.backend);
  EXPECT_EQ(b.status, Status::kPassed) << b.message;
  ASSERT_EQ(a.metrics.size(), b.metrics.size());
  for (std::size_t k = 0; k < a.metrics.size(); ++k) {
    EXPECT_EQ(a.metrics[k].max_abs, b.metrics[k].max_abs) << a.metrics[k].output;
    EXPECT_EQ(a.metrics[k].nmse, b.metrics[k].nmse) << a.metrics[k].output;
    EXPECT_EQ(a.metrics[k].err_baseline, b.metrics[k].err_baseline) << a.metrics[k].output;
  }
}

// The records of cpu.paged alone, without a staging (every later run's bits).
Record host_path_record(const RunConfig& cfg) {
  std::vector<std::unique_ptr<Backend>> alone;
  alone.push_back(make_cpu_paged());
  const std::vector<Record> want = run_cases(cfg, alone);
  EXPECT_EQ(want.size(), 1u);
  EXPECT_EQ(want.at(0).status, Status::kPassed) << want.at(0).message;
  return want.at(0);
}

// Three backends that read prefill inputs on the device (the second writes
// into what it is lent) and one that reads them on the host, run under a
// staging.
struct Lineup {
  std::vector<std::unique_ptr<Backend>> backends;
  OnDevice* first = nullptr;
  OnDevice* third = nullptr;
  HostOnly* host = nullptr;
  std::vector<Record> records;
};
std::unique_ptr<Lineup> run_lineup(const RunConfig& cfg, const DeviceStaging& staging) {
  auto l = std::make_unique<Lineup>();
  l->backends.push_back(std::make_unique<OnDevice>(false));
  l->backends.push_back(std::make_unique<OnDevice>(true));
  l->backends.push_back(std::make_unique<OnDevice>(false));
  l->backends.push_back(std::make_unique<HostOnly>());
  l->first = static_cast<OnDevice*>(l->backends[0].get());
  l->third = static_cast<OnDevice*>(l->backends[2].get());
  l->host = static_cast<HostOnly*>(l->backends[3].get());
  const DeviceStagingScope scope(&staging);
  l->records = run_cases(cfg, l->backends);
  return l;
}

TEST(DeviceStaging, OneUploadPerEntryAndTheHostPathsBits) {
  const RunConfig cfg = config();
  const Record want = host_path_record(cfg);
  g_counts = {};
  const auto l = run_lineup(cfg, kFake);
  ASSERT_EQ(l->records.size(), 4u);
  for (const Record& r : l->records) expect_same_metrics(want, r);
  // A causal call and at least two chunks of context per backend.
  ASSERT_GE(l->first->calls, 3);
  EXPECT_EQ(l->first->device_calls, l->first->calls);
  EXPECT_EQ(l->third->device_calls, l->third->calls);
  EXPECT_EQ(l->first->other_on_device, 0);  // q and the outputs stay on the host
  EXPECT_EQ(l->host->device_calls, 0);
  EXPECT_EQ(l->host->calls, l->first->calls);
  // K and V of each entry uploaded once; every call of the three lent copies of them.
  EXPECT_EQ(g_counts.uploads, 2 * l->first->calls);
  EXPECT_EQ(g_counts.from_device, 2 * 3 * l->first->calls);
  EXPECT_EQ(g_counts.from_host, 0);
  EXPECT_EQ(g_counts.releases, 1);  // the scope's end
}

// With a projector in the staging, the prefill path's K and V are made on the
// "device" and never in host memory: nothing uploaded from the host, one
// projection per memo entry, every call lent scratch copies (the scribbler
// reaches no one), host views for the host-only backend, and every record's
// bits those of the host path. With an emulator that projects from the
// latent rows itself the baseline needs no host rows either, and its
// err_baseline is the same.
TEST(DeviceStaging, KAndVProjectedOnTheDeviceNeverPassThroughTheHost) {
  for (const bool emulator : {false, true}) {
    SCOPED_TRACE(emulator ? "an emulator that projects" : "the CPU's core");
    const std::optional<AttentionEmulatorScope> emulation =
        emulator ? std::optional<AttentionEmulatorScope>(std::in_place, emulate_attention_fixed_order) : std::nullopt;
    const RunConfig cfg = config();
    const Record want = host_path_record(cfg);
    g_counts = {};
    g_projections = 0;
    const auto l = run_lineup(cfg, kFakeProjecting);
    ASSERT_EQ(l->records.size(), 4u);
    for (const Record& r : l->records) expect_same_metrics(want, r);
    ASSERT_GE(l->first->calls, 3);
    EXPECT_EQ(l->first->device_calls, l->first->calls);
    EXPECT_EQ(l->third->device_calls, l->third->calls);
    EXPECT_EQ(l->host->device_calls, 0);
    EXPECT_EQ(l->host->calls, l->first->calls);
    EXPECT_EQ(g_projections, l->first->calls);  // once per entry, whatever the backends
    EXPECT_EQ(g_counts.uploads, 0);             // no host K and V went up
    EXPECT_EQ(g_counts.from_host, 0);
    EXPECT_EQ(g_counts.from_device, 2 * 3 * l->first->calls);
  }
}

TEST(DeviceStaging, AFailingStagingGivesHostViewsNotACrash) {
  const RunConfig cfg = config();
  const Record want = host_path_record(cfg);
  for (const DeviceStaging* staging : {&kFull, &kFullProjecting}) {
    SCOPED_TRACE(staging->project ? "with a projector" : "uploads");
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(std::make_unique<OnDevice>(false));
    auto* b = static_cast<OnDevice*>(bs[0].get());
    std::vector<Record> got;
    {
      const DeviceStagingScope scope(staging);
      got = run_cases(cfg, bs);
    }
    ASSERT_EQ(got.size(), 1u);
    expect_same_metrics(want, got[0]);  // PASSED, the harness's failure not blamed on the backend
    EXPECT_GE(b->calls, 3);
    EXPECT_EQ(b->device_calls, 0);
  }
}

TEST(DeviceStaging, WithoutAStagingEveryBackendGetsHostViews) {
  ASSERT_EQ(device_staging(), nullptr);
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(std::make_unique<OnDevice>(false));
  auto* b = static_cast<OnDevice*>(bs[0].get());
  const std::vector<Record> got = run_cases(config(), bs);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, Status::kPassed) << got[0].message;
  EXPECT_GE(b->calls, 3);
  EXPECT_EQ(b->device_calls, 0);
}

}  // namespace
}  // namespace mlagate
