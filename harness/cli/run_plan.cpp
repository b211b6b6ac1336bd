// The run's plan from its flags (run_plan.h): --order, --op, --shard,
// --devices (moved out of cmd_run.cpp as they were), the devices' memory, and
// what computes beside the backends: --baseline, --reference and the check of
// the reference's device (configure_computation, start_device_check).
#include "harness/cli/run_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <span>
#include <stdexcept>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "cases/errors.h"
#include "harness/cli/commands.h"
#include "mlagate/config.h"
#include "reference/torch/torch_reference.h"
#if MLAGATE_HAS_CUDA
#include "backends/cuda/cuda_backends.h"
#include "reference/cuda/cuda_reference.h"
#endif

namespace mlagate {

// --order: the cases in another order (every order runs the same records).
void apply_order(std::vector<CaseSpec>& cases, const std::string& order) {
  if (order == "given" || order == "pairs") return;  // pairs: the isolated runner pairs them (isolate.h)
  if (order == "reverse") {
    std::reverse(cases.begin(), cases.end());
    return;
  }
  if (order.rfind("shuffle:", 0) == 0) {
    std::uint64_t seed = 0;
    try {
      std::size_t pos = 0;
      seed = std::stoull(order.substr(8), &pos);
      if (pos != order.size() - 8) throw std::invalid_argument(order);
    } catch (const std::exception&) {
      throw InputError("--order '" + order + "': shuffle:SEED needs a non-negative integer seed");
    }
    // Fisher-Yates over splitmix64: the same order on every platform and library
    // (std::shuffle's use of the engine is implementation-defined).
    auto next = [&seed] {
      std::uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    for (std::size_t i = cases.size(); i > 1; --i) std::swap(cases[i - 1], cases[next() % i]);
    return;
  }
  throw InputError("--order '" + order + "' (expected given, reverse, shuffle:SEED or pairs)");
}

namespace {
// What --op auto gives a case that names no ops.
std::vector<Op> default_ops(const CaseSpec& c) {
  if (c.merge.active()) return {Op::kMergeStates};
  if (c.sparse.active()) return {Op::kSparseDecode, Op::kSparsePrefill};
  return {Op::kLayer};
}
}  // namespace

void give_cases_their_ops(std::vector<CaseSpec>& cases, const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), "auto") == names.end()) return;
  if (std::none_of(cases.begin(), cases.end(), [](const CaseSpec& c) { return !c.ops.empty(); })) return;
  std::vector<Op> named;
  for (const auto& o : names)
    if (o != "auto") named.push_back(parse_op(o));
  for (CaseSpec& c : cases) {
    if (!c.ops.empty()) continue;
    c.ops = named;
    for (Op op : default_ops(c))
      if (std::find(c.ops.begin(), c.ops.end(), op) == c.ops.end()) c.ops.push_back(op);
  }
}

// --op: "auto" is the ops cases name (a suite group's `ops`), then layer for
// the other dense cases, the two sparse ops for sparse ones and merge_states
// for merge cases; each op once, in the order given.
std::vector<Op> resolve_ops(const std::vector<std::string>& names, const std::vector<CaseSpec>& cases) {
  std::vector<Op> ops;
  auto add = [&ops](Op op) {
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  };
  for (const auto& o : names) {
    if (o != "auto") {
      add(parse_op(o));
      continue;
    }
    // A case that names its ops (a suite group's `ops`) brings those; the
    // others, the default of their kind.
    for (Op op : all_ops())
      if (std::any_of(cases.begin(), cases.end(), [op](const CaseSpec& c) { return !c.ops.empty() && c.takes(op); })) add(op);
    for (const CaseSpec& c : cases)
      if (c.ops.empty())
        for (Op op : default_ops(c)) add(op);
    if (cases.empty()) add(Op::kLayer);
  }
  return ops;
}

// --shard I/N, else GoogleTest's sharding variables (so a ctest or gtest-style
// runner that shards tests shards mlagate too); nullopt: the whole selection.
std::optional<Shard> resolve_shard(const std::string& flag) {
  if (!flag.empty()) {
    const std::optional<Shard> s = parse_shard(flag);
    if (!s) throw InputError("--shard '" + flag + "' (expected I/N with 0 <= I < N)");
    return s;
  }
  const char* total = std::getenv("GTEST_TOTAL_SHARDS");
  const char* index = std::getenv("GTEST_SHARD_INDEX");
  if (!total || !index) return std::nullopt;
  const std::string text = std::string(index) + "/" + total;
  const std::optional<Shard> s = parse_shard(text);
  if (!s) throw InputError("GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS = " + text + " (expected 0 <= index < total)");
  // The protocol: a program that honours sharding creates this file.
  if (const char* status = std::getenv("GTEST_SHARD_STATUS_FILE"); status && *status) std::fclose(std::fopen(status, "a"));
  return s;
}

std::vector<std::string> resolve_devices(const std::vector<std::string>& flag) {
  std::vector<std::string> devices = flag;
  if (std::find(devices.begin(), devices.end(), "all") != devices.end()) {
    if (devices.size() != 1) throw InputError("--devices: 'all' stands alone (not in a list of devices)");
    devices.clear();
#if MLAGATE_HAS_CUDA
    // A worker gets one of these as its own CUDA_VISIBLE_DEVICES.
    // Counted without a context (cuInit only): this process makes none.
    std::string why;
    const int count = cuda_visible_device_count(why);
    if (count == 0) throw InputError("--devices all: " + why);
    std::vector<std::string> visible;
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
      std::stringstream ss(v);
      for (std::string id; std::getline(ss, id, ',');)
        if (!id.empty()) visible.push_back(id);
    }
    for (int i = 0; i < count; ++i)
      devices.push_back(static_cast<std::size_t>(i) < visible.size() ? visible[static_cast<std::size_t>(i)]
                                                                     : std::to_string(i));
#else
    throw InputError("--devices all: this mlagate was built without CUDA (no GPU to count)");
#endif
  }
  std::set<std::string> seen;
  for (const std::string& d : devices)
    if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos || !seen.insert(d).second)
      throw InputError("--devices: '" + d + "' is not a device number, or is given twice");
  return devices;
}

namespace {

// This process's ordinal of the device a worker sees as CUDA_VISIBLE_DEVICES
// = `device` (empty: the first visible one); -1 when this process does not
// see it.
int device_ordinal(const std::string& device) {
  if (device.empty()) return 0;
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!v || !*v) return std::stoi(device);  // resolve_devices checked it is a number
  std::stringstream ss(v);
  int i = 0;
  for (std::string id; std::getline(ss, id, ','); ++i)
    if (id == device) return i;
  return -1;
}

}  // namespace

DeviceMemoryPlan plan_device_memory(const RunConfig& cfg, const std::vector<std::unique_ptr<Backend>>& backends,
                                    const std::vector<std::string>& devices, int splits, bool refuse,
                                    double cap_gib) {
  DeviceMemoryPlan plan;
#if MLAGATE_HAS_CUDA
  if (cfg.reference.name != "cuda") return plan;
  DeviceEstimateOptions opt;
  opt.forced_splits = std::max(0, splits);
  opt.torch = cfg.baseline.name == "torch";
  opt.device_inputs = false;
  for (const auto& b : backends) {
    opt.torch = opt.torch || b->name().rfind("torch.", 0) == 0;
    opt.device_inputs = opt.device_inputs || b->capabilities().device_inputs;
  }
  plan.worker_bytes = worker_device_overhead_bytes(opt.torch);
  const std::vector<std::string> named = devices.empty() ? std::vector<std::string>{""} : devices;
  std::size_t smallest = 0;
  for (std::size_t d = 0; d < named.size(); ++d) {
    const int ordinal = device_ordinal(named[d]);
    std::uint64_t total = ordinal < 0 ? 0 : cuda_device_total_bytes(ordinal);
    if (cap_gib > 0) total = std::min<std::uint64_t>(total, static_cast<std::uint64_t>(cap_gib * (1ull << 30)));
    plan.device_bytes.push_back(total);
    const std::uint64_t b = plan.device_bytes[d];
    if (b > 0 && (plan.device_bytes[smallest] == 0 || b < plan.device_bytes[smallest])) smallest = d;
  }
  opt.device_bytes = plan.device_bytes[smallest];
  for (const CaseSpec& c : cfg.cases) {
    opt.prefill_op = runs_prefill_op(c, cfg.ops);  // per case: explore's rounds give each case its op
    plan.case_bytes.push_back(estimate_case_device_bytes(c, opt));
  }
  if (refuse)
    refuse_cases_beyond_device(cfg.cases, plan.case_bytes, plan.worker_bytes, plan.device_bytes[smallest],
                               "device " + (named[smallest].empty() ? std::string("0") : named[smallest]) +
                                   (cap_gib > 0 ? " as --device-memory plans it" : ""));
#else
  (void)cfg, (void)backends, (void)devices, (void)splits, (void)refuse, (void)cap_gib;
#endif
  return plan;
}

namespace {

// --baseline: where err_baseline comes from.
BaselineImpl make_baseline(const std::string& name) {
  BaselineImpl b;
  b.always = true;  // min_fudge in every verdict, whatever the policy
  if (name == "emulated") return b;
  if (name == "none") {
    b.name = "none";
    b.always = false;
    return b;
  }
  if (name == "torch") {
    if (!torch_reference_available())
      throw InputError("--baseline torch: no libtorch reference (" + torch_reference_info() + ")");
    b.name = "torch";
    const TorchReferenceOptions options{.cuda = torch_cuda_available()};  // the GPU when there is one
    b.layer = [options](const Case& c, SdpaForm form, std::span<const int> requests) {
      try {
        return torch_sdpa_layer(c, form, requests, options);
      } catch (const NotSupportedError& e) {  // this case only (fp16 on a CPU libtorch 1.x): SKIPPED
        throw BaselineUnavailableError(std::string("--baseline torch cannot compute this case: ") + e.what());
      }
    };
    return b;
  }
  throw InputError("--baseline '" + name + "' (expected emulated, torch or none)");
}

#if MLAGATE_HAS_CUDA
// The device --reference cuda computes on, or an InputError saying why not.
void require_reference_device() {
  if (!cuda_device_info().available) throw InputError("--reference cuda: " + cuda_device_info().error);
}
#endif

// --reference: the fp64 reference on the CPU (Eigen) or on the GPU; the
// device is checked here unless the caller checks it (start_device_check).
ReferenceImpl make_reference(const std::string& name, bool check_device) {
  ReferenceImpl r;
  if (name == "eigen") return r;
  if (name == "cuda") {
#if MLAGATE_HAS_CUDA
    if (check_device) require_reference_device();
    r.name = "cuda";
    r.absorbed = cuda_reference_absorbed;
    r.mqa = cuda_reference_mqa;
    r.on_device = true;  // a stream of its own, no host threads: safe beside the emulation
    return r;
#else
    throw InputError("--reference cuda: this build has no CUDA");
#endif
  }
  throw InputError("--reference '" + name + "' (expected eigen or cuda)");
}

}  // namespace

void configure_computation(const RunArgs& ra, RunConfig& cfg, bool check_device) {
  cfg.policy = ra.policy.make();
  cfg.baseline = make_baseline(ra.baseline);
  if (cfg.baseline.name == "none" && cfg.policy.kind == Policy::Kind::kBaseline)
    throw InputError("--baseline none: the baseline policy needs err_baseline (choose --policy vllm or fixed)");
  const CacheOptions cache = ra.poison.cache_options();
  cfg.exec.poison = cache.poison;
  cfg.exec.poison_block_table = cache.poison_block_table;
  cfg.exec.reuse_buffers = ra.reuse_buffers;
  if (ra.prefill_chunk < 1) throw InputError("--prefill-chunk must be >= 1");
  cfg.exec.prefill_chunk = ra.prefill_chunk;
  if (ra.splits < 0) throw InputError("--splits must be >= 1 (or 0: chosen from the work)");
  cfg.reference = make_reference(ra.reference, check_device);
}

// --reference cuda's device, checked on a thread of its own: making its
// context takes about 0.2 s (on a host of several GPUs, its cuInit about 1 s),
// which a worker spends making its first case (worker_main's device_ready)
// and the run in this process planning. A parent of workers checks nothing:
// its workers' checks are the run's (PERFORMANCE.md, "Workers started before
// the parent's CUDA"). get() throws the InputError make_reference would have thrown.
std::shared_future<void> start_device_check() {
  auto check = [] {
#if MLAGATE_HAS_CUDA
    require_reference_device();
#endif
  };
  try {
    return std::async(std::launch::async, check).share();
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, check).share();  // no thread to be had: checked when waited for
  }
}

}  // namespace mlagate
