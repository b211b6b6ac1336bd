// Loading plugin libraries (dlopen, RAII) and checking their tables, and the
// Backend each exported mlagate_backend becomes: arguments as DLTensors on the
// backend's device, statuses and messages back as mlagate's exceptions, and
// C++ exceptions that escape a plugin caught at the boundary.
#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/plugin/abi.h"
#include "backends/plugin/device_stage.h"
#include "backends/plugin/plugin_backends.h"

namespace mlagate {

namespace {

using plugin::DlTensors;
using plugin::Problem;

constexpr std::size_t kMessageBytes = 4096;
constexpr int kMaxBackends = 256;
constexpr int kMaxBlockSizes = 64;
constexpr std::size_t kMaxNameBytes = 64;
// The ABI 1.0 tables end where 1.1 appended its fields.
constexpr std::size_t kPluginV10Size = offsetof(mlagate_plugin, abi_minor);
constexpr std::size_t kBackendV10Size = offsetof(mlagate_backend, graph_ops);

// One loaded library. Loads of the same file share one (dlopen returns the same
// handle and the same static tables). RTLD_NODELETE keeps the code mapped after
// the last user: a plugin's thread-local destructors and atexit handlers stay
// valid until the process exits.
class Library {
 public:
  Library(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  ~Library() {
    if (!backends_.empty()) {
      for (const mlagate_backend& b : backends_) {
        if (!b.destroy) continue;
        try {
          b.destroy(b.self);
        } catch (...) {
          std::fprintf(stderr, "mlagate: warning: %s: an exception escaped destroy() of %s (ignored)\n", path_.c_str(),
                       b.name);
        }
      }
    }
    dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  void* handle() const { return handle_; }
  const std::string& path() const { return path_; }
  // The library's backend tables, each copied into this header's
  // mlagate_backend (fields of a newer minor than the plugin's zero); empty
  // until validated.
  const std::vector<mlagate_backend>& backends() const { return backends_; }
  void set_backends(std::vector<mlagate_backend> b) { backends_ = std::move(b); }

 private:
  void* handle_;
  std::string path_;
  std::vector<mlagate_backend> backends_;  // set once validated: destroy() is only called on checked tables
};

// Printable, one line, at most max bytes (a plugin's message buffer or name).
std::string clean(const char* s, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < max && s[i] != '\0'; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    out += ch == '\n' || ch == '\r' || ch == '\t' ? ' ' : (ch < 0x20 || ch == 0x7f ? '?' : static_cast<char>(ch));
  }
  return out;
}

// A message buffer with a guard zone: a plugin that writes past message_size
// is reported instead of silently corrupting the host's memory.
class MessageBuffer {
 public:
  MessageBuffer() : buf_(kMessageBytes + kGuard, '\xA5') { std::fill_n(buf_.begin(), kMessageBytes, '\0'); }
  char* data() { return buf_.data(); }
  std::size_t size() const { return kMessageBytes; }
  bool overflowed() const {
    return std::any_of(buf_.begin() + kMessageBytes, buf_.end(), [](char c) { return c != '\xA5'; });
  }
  std::string text() const { return clean(buf_.data(), kMessageBytes); }

 private:
  static constexpr std::size_t kGuard = 256;
  std::vector<char> buf_;
};

class PluginBackend final : public Backend {
 public:
  PluginBackend(std::shared_ptr<Library> lib, const mlagate_backend& b)
      : lib_(std::move(lib)), b_(b), name_(b.name), description_(b.description ? clean(b.description, 1024) : ""),
        caps_(plugin::capabilities_of(b)) {}

  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  Capabilities capabilities() const override { return caps_; }

  Support supports(const CaseSpec& spec, Op op) const override {
    // The runner asks before it runs: the case names the calls that follow.
    last_spec_ = spec;
    Support s = check_capabilities(caps_, spec, op);
    if (!s.ok || !b_.supports) return s;
    Problem p;
    try {
      p = plugin::case_problem(spec, op, caps_);
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
    const mlagate_problem cp = p.to_c(b_.device);
    MessageBuffer reason;
    std::int32_t yes = 0;
    boundary("supports()", [&] { yes = b_.supports(b_.self, &cp, reason.data(), reason.size()); });
    if (reason.overflowed())
      return Support::no(name_ + ": supports() wrote past the end of its reason buffer (" + std::to_string(reason.size()) +
                         " bytes)");
    if (yes != 0) return Support::yes();
    const std::string why = reason.text();
    return Support::no(why.empty() ? name_ + " declines the case (supports() gave no reason)" : why);
  }

  void decode(const DecodeArgs& a) override {
    if (!has(Op::kDecode)) Backend::decode(a);
    auto stage = plugin::make_device_stage(b_.device);
    decode_on(*stage, a, Launch::kEager);
  }

  // Graph mode (plugin.h, graph_ops): the harness's persistent arguments
  // (persistent_decode_graph) staged into persistent device buffers; a CUDA
  // plugin's run() captured once and replayed, prepare() before each replay;
  // a host plugin's prepare() and run() called on the same buffers.
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override {
    if ((b_.graph_ops & MLAGATE_OP_DECODE) == 0)
      throw NotSupportedError(name_ + " declares no graph ops (mlagate_backend.graph_ops, plugin ABI 1.1): its decode "
                                      "cannot be captured");
    if (b_.device.device_type == kDLCPU)
      return persistent_decode_graph(a, [this](const DecodeArgs& p, bool) { decode(p); },
                                     "host plugin: prepare() and run() on persistent buffers");
    std::shared_ptr<plugin::DeviceStage> stage = plugin::make_device_stage(b_.device, true);
    return persistent_decode_graph(
        a,
        [this, stage](const DecodeArgs& p, bool capture) {
          if (!capture) stage->rewind();
          decode_on(*stage, p, capture ? Launch::kCapture : Launch::kReplay);
        },
        "CUDA graph of the plugin's run(), prepare() before each replay");
  }

  void prefill(const PrefillArgs& a) override {
    if (!has(Op::kPrefill)) Backend::prefill(a);
    const Problem p = plugin::prefill_problem(a, spec_ptr());
    const std::int64_t b = static_cast<std::int64_t>(a.cu_seqlens_q.size());
    auto stage = plugin::make_device_stage(b_.device);
    DlTensors t(b_.device);
    mlagate_args args = empty_args(*stage);
    mlagate_prefill_args& f = args.prefill;
    f.q = t.make(stage->input(a.q.data, a.q.nbytes()), a.q.dtype, a.q.shape);
    f.k = t.make(stage->input(a.k.data, a.k.nbytes()), a.k.dtype, a.k.shape);
    f.v = t.make(stage->input(a.v.data, a.v.nbytes()), a.v.dtype, a.v.shape);
    f.cu_seqlens_q = t.make(stage->input(a.cu_seqlens_q.data(), a.cu_seqlens_q.size_bytes()), DType::kI32, {b});
    f.cu_seqlens_k = t.make(stage->input(a.cu_seqlens_k.data(), a.cu_seqlens_k.size_bytes()), DType::kI32, {b});
    f.o = t.make(stage->output(a.o, "o"), a.o.dtype, a.o.shape);
    f.lse = t.make(stage->output(a.lse, "lse"), a.lse.dtype, a.lse.shape);
    run(p, args, {{"o", &f.o}, {"lse", &f.lse}});
    stage->finish();
  }

  // The sparse ops (ABI 1.2). Every input goes over as a checked copy: a
  // plugin that writes into an index row, a length or the cache is recorded
  // (INCORRECT, naming the input) and cannot change what later backends get.
  void sparse_decode(const SparseDecodeArgs& a) override {
    if (!has(Op::kSparseDecode)) Backend::sparse_decode(a);
    const Problem p = plugin::sparse_decode_problem(a, spec_ptr());
    const PagedCache& cache = *a.cache;
    const std::vector<std::int32_t> table = plugin::call_block_table(cache, a.block_table_rows);
    const std::int64_t b = static_cast<std::int64_t>(a.seq_lens.size()), T = a.q.shape.at(0);
    auto stage = plugin::make_device_stage(b_.device);
    DlTensors t(b_.device);
    mlagate_args args = empty_args(*stage);
    mlagate_sparse_decode_args& d = args.sparse_decode;
    d.q = t.make(stage->checked_input(a.q.data, a.q.nbytes(), 2, "q"), a.q.dtype, a.q.shape);
    d.kv_cache = cache_tensor(t, *stage, cache, "kv_cache");
    d.block_table = checked(t, *stage, table.data(), DType::kI32, {b, cache.block_table.dim(1)}, "block_table");
    d.seq_lens = checked(t, *stage, a.seq_lens.data(), DType::kI32, {b}, "seq_lens");
    d.query_start_loc = checked(t, *stage, a.query_start_loc.data(), DType::kI32, {b + 1}, "query_start_loc");
    if (given(a.indices))
      d.indices = checked(t, *stage, a.indices.data, DType::kI32, a.indices.shape, "indices");
    if (!a.topk_length.empty()) d.topk_length = checked(t, *stage, a.topk_length.data(), DType::kI32, {T}, "topk_length");
    if (a.extra_cache) d.extra_kv_cache = cache_tensor(t, *stage, *a.extra_cache, "extra_kv_cache");
    if (given(a.extra_indices))
      d.extra_indices = checked(t, *stage, a.extra_indices.data, DType::kI32, a.extra_indices.shape, "extra_indices");
    if (!a.extra_topk_length.empty())
      d.extra_topk_length = checked(t, *stage, a.extra_topk_length.data(), DType::kI32, {T}, "extra_topk_length");
    if (!a.sink.empty())
      d.sink = checked(t, *stage, a.sink.data(), DType::kF32, {static_cast<std::int64_t>(a.sink.size())}, "sink");
    d.o = t.make(stage->output(a.o, "o"), a.o.dtype, a.o.shape);
    d.lse = t.make(stage->output(a.lse, "lse"), a.lse.dtype, a.lse.shape);
    prepare(p, args);
    run(p, args, {{"o", &d.o}, {"lse", &d.lse}});
    stage->finish();
  }

  void sparse_prefill(const SparsePrefillArgs& a) override {
    if (!has(Op::kSparsePrefill)) Backend::sparse_prefill(a);
    const Problem p = plugin::sparse_prefill_problem(a, spec_ptr());
    const std::int64_t T = a.q.shape.at(0);
    auto stage = plugin::make_device_stage(b_.device);
    DlTensors t(b_.device);
    mlagate_args args = empty_args(*stage);
    mlagate_sparse_prefill_args& f = args.sparse_prefill;
    f.q = t.make(stage->checked_input(a.q.data, a.q.nbytes(), 2, "q"), a.q.dtype, a.q.shape);
    f.kv = t.make(stage->checked_input(a.kv.data, a.kv.nbytes(), 2, "kv"), a.kv.dtype, a.kv.shape);
    f.indices = checked(t, *stage, a.indices.data, DType::kI32, a.indices.shape, "indices");
    if (!a.topk_length.empty()) f.topk_length = checked(t, *stage, a.topk_length.data(), DType::kI32, {T}, "topk_length");
    if (!a.sink.empty())
      f.sink = checked(t, *stage, a.sink.data(), DType::kF32, {static_cast<std::int64_t>(a.sink.size())}, "sink");
    f.o = t.make(stage->output(a.o, "o"), a.o.dtype, a.o.shape);
    f.lse = t.make(stage->output(a.lse, "lse"), a.lse.dtype, a.lse.shape);
    prepare(p, args);
    run(p, args, {{"o", &f.o}, {"lse", &f.lse}});
    stage->finish();
  }

  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    if (!has(Op::kCacheWrite)) return Backend::cache_write(cache, kv_c, k_pe, slots);
    const Problem p = plugin::cache_write_problem(cache, kv_c, k_pe, slots.size(), spec_ptr());
    const std::int64_t n = static_cast<std::int64_t>(slots.size());
    auto stage = plugin::make_device_stage(b_.device);
    DlTensors t(b_.device);
    mlagate_args args = empty_args(*stage);
    mlagate_cache_write_args& w = args.cache_write;
    w.kv_c = t.make(stage->input(kv_c.data, kv_c.nbytes()), kv_c.dtype, kv_c.shape);
    w.k_pe = t.make(stage->input(k_pe.data, k_pe.nbytes()), k_pe.dtype, k_pe.shape);
    w.slot_mapping = t.make(stage->input(slots.data(), slots.size_bytes()), DType::kI64, {n});
    w.kv_cache = t.make(stage->output(cache.data.view(), "kv_cache"), DType::kU8, cache.data.shape());
    run(p, args, {{"kv_cache", &w.kv_cache}});
    stage->finish();
  }

 private:
  bool has(Op op) const { return std::find(caps_.ops.begin(), caps_.ops.end(), op) != caps_.ops.end(); }

  // How a decode call reaches the plugin: eagerly (prepare, run), as a graph's
  // capture (prepare, run as the warm-up, run again under stream capture) or
  // as a replay (prepare, the captured graph).
  enum class Launch { kEager, kCapture, kReplay };

  void decode_on(plugin::DeviceStage& stage, const DecodeArgs& a, Launch how) {
    const Problem p = plugin::decode_problem(a, spec_ptr());
    const std::vector<std::int32_t> table = plugin::call_block_table(a);
    const PagedCache& cache = *a.cache;
    const std::int64_t b = static_cast<std::int64_t>(a.seq_lens.size());
    DlTensors t(b_.device);
    mlagate_args args = empty_args(stage);
    mlagate_decode_args& d = args.decode;
    // Strided views (ABI 1.3, only to backends that declare them): a host
    // stage lends the harness's pointers, a CUDA stage uploads each view's
    // whole span (its outputs are device copies of the span: padding included).
    d.q_lat = t.make(stage.input(a.q_lat.data, a.q_lat.span_bytes()), a.q_lat.dtype, a.q_lat.shape, a.q_lat.strides);
    d.q_pe = t.make(stage.input(a.q_pe.data, a.q_pe.span_bytes()), a.q_pe.dtype, a.q_pe.shape, a.q_pe.strides);
    d.kv_cache = t.make(stage.input(cache.data.bytes(), cache.data.nbytes()), DType::kU8, cache.data.shape());
    d.block_table = t.make(stage.input(table.data(), table.size() * 4), DType::kI32, {b, cache.block_table.dim(1)});
    d.seq_lens = t.make(stage.input(a.seq_lens.data(), a.seq_lens.size_bytes()), DType::kI32, {b});
    d.query_start_loc =
        t.make(stage.input(a.query_start_loc.data(), a.query_start_loc.size_bytes()), DType::kI32, {b + 1});
    d.o_lat = t.make(stage.output(a.o_lat, "o_lat"), a.o_lat.dtype, a.o_lat.shape, a.o_lat.strides);
    d.lse = t.make(stage.output(a.lse, "lse"), a.lse.dtype, a.lse.shape, a.lse.strides);
    const std::initializer_list<OutputDescriptor> outputs = {{"o_lat", &d.o_lat}, {"lse", &d.lse}};
    prepare(p, args);
    if (how == Launch::kReplay) {
      stage.replay();
    } else {
      run(p, args, outputs);
      if (how == Launch::kCapture) {
        stage.finish();  // the warm-up's faults are its own, before the capture
        stage.capture([&] { run(p, args, outputs); });
        return;
      }
    }
    stage.finish();
  }
  const CaseSpec* spec_ptr() const { return last_spec_ ? &*last_spec_ : nullptr; }

  // An optional tensor of the args (a default TensorView is "not given").
  static bool given(const TensorView& v) { return v.data != nullptr && !v.shape.empty(); }
  // A 4-byte-element input (indices, lengths, block table, sink) as a checked copy.
  static DLTensor checked(DlTensors& t, plugin::DeviceStage& stage, const void* data, DType dt, const Shape& shape,
                          const char* name) {
    std::int64_t n = 1;
    for (std::int64_t e : shape) n *= e;
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dt);
    return t.make(stage.checked_input(data, bytes, dtype_size(dt), name), dt, shape);
  }
  // A paged cache's bytes, checked: [num_blocks, block_size, entry_bytes], or
  // fp8_v4's split pages [num_blocks, block_bytes] (plugin.h).
  static DLTensor cache_tensor(DlTensors& t, plugin::DeviceStage& stage, const PagedCache& c, const char* name) {
    return t.make(stage.checked_input(c.data.bytes(), c.data.nbytes(), 1, name), DType::kU8, c.data.shape());
  }

  static mlagate_args empty_args(plugin::DeviceStage& stage) {
    mlagate_args args{};
    args.struct_size = sizeof(mlagate_args);
    args.stream = stage.stream();
    return args;
  }

  // A C++ exception must not cross the C boundary; when one does anyway (same
  // C++ runtime: the unwinder gets here), it is a contract violation recorded
  // as CRASHED with what it said.
  template <class F>
  void boundary(const char* what, F&& call) const {
    try {
      call();
    } catch (const std::exception& e) {
      throw std::runtime_error(name_ + ": a C++ exception escaped " + what +
                               " across the C boundary (contract violation: catch inside the plugin and return "
                               "MLAGATE_STATUS_ERROR): " + e.what());
    } catch (...) {
      throw std::runtime_error(name_ + ": an exception of unknown type escaped " + what +
                               " across the C boundary (contract violation: catch inside the plugin)");
    }
  }

  // An output as mlagate described it to run(): the plugin writes into these
  // tensors and must leave their descriptors alone.
  struct OutputDescriptor {
    const char* name;
    const DLTensor* tensor;
  };
  struct DescriptorCopy {
    DLTensor t;
    std::vector<std::int64_t> shape, strides;
  };
  static DescriptorCopy copy_of(const DLTensor& t) {
    DescriptorCopy c{t, {}, {}};
    c.shape.assign(t.shape, t.shape + t.ndim);
    if (t.strides) c.strides.assign(t.strides, t.strides + t.ndim);
    return c;
  }
  static std::string dims(const std::int64_t* d, std::int32_t n) {
    std::string s = "[";
    for (std::int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  }
  // What a plugin changed in an output's descriptor: the outputs mlagate reads
  // back are the buffers of the shape, dtype and device it passed, so a plugin
  // that re-describes its output (another shape, dtype or device, another
  // buffer) produced something other than what is checked. "" when unchanged.
  // The plugin's own pointers are never dereferenced.
  static std::string descriptor_change(const DescriptorCopy& before, const DLTensor& after) {
    const DLTensor& b = before.t;
    if (after.device.device_type != b.device.device_type || after.device.device_id != b.device.device_id)
      return "device " + plugin::dl_device_str(b.device) + " -> " + plugin::dl_device_str(after.device);
    if (after.dtype.code != b.dtype.code || after.dtype.bits != b.dtype.bits || after.dtype.lanes != b.dtype.lanes)
      return "dtype " + plugin::dl_dtype_str(b.dtype) + " -> " + plugin::dl_dtype_str(after.dtype);
    if (after.ndim != b.ndim)
      return "rank " + std::to_string(b.ndim) + " -> " + std::to_string(after.ndim) + " (shape " +
             dims(before.shape.data(), b.ndim) + ")";
    if (after.shape != b.shape) return "shape " + dims(before.shape.data(), b.ndim) + " replaced by another array";
    if (!std::equal(before.shape.begin(), before.shape.end(), after.shape))
      return "shape " + dims(before.shape.data(), b.ndim) + " -> " + dims(after.shape, after.ndim);
    if (after.strides != b.strides ||
        (b.strides && !std::equal(before.strides.begin(), before.strides.end(), after.strides)))
      return "strides changed";
    if (after.data != b.data || after.byte_offset != b.byte_offset) return "data pointer moved to another buffer";
    return "";
  }

  // The plugin's prepare() (when it has one), reported as run() is.
  void prepare(const Problem& p, const mlagate_args& args) {
    if (!b_.prepare) return;
    const mlagate_problem cp = p.to_c(b_.device);
    MessageBuffer msg;
    std::int32_t status = MLAGATE_STATUS_ERROR;
    boundary("prepare()", [&] { status = b_.prepare(b_.self, &cp, &args, msg.data(), msg.size()); });
    report(p, "prepare()", status, msg);
  }

  void run(const Problem& p, const mlagate_args& args, std::initializer_list<OutputDescriptor> outputs) {
    const mlagate_problem cp = p.to_c(b_.device);
    MessageBuffer msg;
    std::vector<DescriptorCopy> before;
    for (const OutputDescriptor& o : outputs) before.push_back(copy_of(*o.tensor));
    std::int32_t status = MLAGATE_STATUS_ERROR;
    boundary("run()", [&] { status = b_.run(b_.self, &cp, &args, msg.data(), msg.size()); });
    const std::string op(op_name(p.op));
    if (status == MLAGATE_STATUS_OK) {
      std::size_t i = 0;
      for (const OutputDescriptor& o : outputs) {
        const std::string change = descriptor_change(before[i++], *o.tensor);
        if (!change.empty())
          throw WrongOutputError(name_ + " " + op + ": run() re-described its output " + o.name + " (" + change +
                                 "); a plugin writes into the output tensors as passed, of their shape, dtype and device");
      }
    }
    report(p, "run()", status, msg);
  }

  // A status and message of run() or prepare() as mlagate's exceptions.
  void report(const Problem& p, const char* what, std::int32_t status, const MessageBuffer& msg) const {
    if (msg.overflowed())
      throw std::runtime_error(name_ + ": " + what + " wrote past the end of its message buffer (" +
                               std::to_string(msg.size()) + " bytes)");
    const std::string m = msg.text();
    const std::string op = std::string(op_name(p.op)) + (std::strcmp(what, "run()") == 0 ? "" : std::string(" ") + what);
    switch (status) {
      case MLAGATE_STATUS_OK: return;
      case MLAGATE_STATUS_NOT_SUPPORTED:
        throw NotSupportedError(m.empty() ? name_ + ": " + op + " not supported (no message)" : m);
      case MLAGATE_STATUS_UNAVAILABLE:
        throw DeviceUnavailableError(m.empty() ? name_ + ": device unavailable (no message)" : m);
      case MLAGATE_STATUS_ERROR:
        throw std::runtime_error(name_ + " " + op + " returned MLAGATE_STATUS_ERROR: " + (m.empty() ? "(no message)" : m));
      default:
        throw std::runtime_error(name_ + " " + op + " returned the unknown status " + std::to_string(status) +
                                 (m.empty() ? "" : ": " + m));
    }
  }

  std::shared_ptr<Library> lib_;  // keeps the code and the tables alive
  const mlagate_backend& b_;
  std::string name_, description_;
  Capabilities caps_;
  mutable std::optional<CaseSpec> last_spec_;
};

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw PluginLoadError("plugin " + path + ": " + why);
}

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

// Every field of one backend table; the first problem found is the message.
// `minor`: the ABI minor the plugin was built against (1.2 bits need 2).
void check_backend(const std::string& path, int index, const mlagate_backend& b, std::uint32_t minor) {
  const std::string at = "backend " + std::to_string(index);
  if (b.name == nullptr) refuse(path, at + ": name is NULL");
  const std::string name = clean(b.name, kMaxNameBytes + 1);
  if (!valid_backend_name(name))
    refuse(path, at + ": name '" + name + "' must be 1-" + std::to_string(kMaxNameBytes) +
                     " characters of letters, digits, '.', '_', '-'");
  const std::string who = at + " (" + name + ")";
  if (b.run == nullptr) refuse(path, who + ": run is NULL");
  constexpr std::uint32_t kOps11 = MLAGATE_OP_DECODE | MLAGATE_OP_PREFILL | MLAGATE_OP_CACHE_WRITE;
  constexpr std::uint32_t kOps12 = kOps11 | MLAGATE_OP_SPARSE_DECODE | MLAGATE_OP_SPARSE_PREFILL;
  const bool v12 = minor >= 2;
  const std::string built = " (built against ABI 1." + std::to_string(minor) + ")";
  if (b.ops == 0 || (b.ops & ~(v12 ? kOps12 : kOps11)) != 0)
    refuse(path, who + ": ops mask " + hex(b.ops) + " must be a non-empty set of DECODE, PREFILL, CACHE_WRITE" +
                     (v12 ? ", SPARSE_DECODE, SPARSE_PREFILL" : built + "; the sparse ops need ABI 1.2"));
  if (b.block_sizes == nullptr || b.num_block_sizes < 1 || b.num_block_sizes > kMaxBlockSizes)
    refuse(path, who + ": block_sizes must point to 1-" + std::to_string(kMaxBlockSizes) + " block sizes");
  for (int i = 0; i < b.num_block_sizes; ++i) {
    const std::int32_t bs = b.block_sizes[i];
    if (bs < 1 || bs > (1 << 16)) refuse(path, who + ": block size " + std::to_string(bs) + " out of range [1, 65536]");
    if (std::count(b.block_sizes, b.block_sizes + b.num_block_sizes, bs) > 1)
      refuse(path, who + ": block size " + std::to_string(bs) + " listed twice");
  }
  if (b.query_len_support > MLAGATE_QUERY_LEN_VARLEN)
    refuse(path, who + ": query_len_support " + std::to_string(b.query_len_support) + " is not SINGLE_ONLY, UNIFORM or VARLEN");
  if (b.reorder_threshold < 1) refuse(path, who + ": reorder_threshold must be >= 1");
  constexpr std::uint32_t kDtypes = MLAGATE_DTYPE_BF16 | MLAGATE_DTYPE_F16;
  if (b.dtypes == 0 || (b.dtypes & ~kDtypes) != 0)
    refuse(path, who + ": dtypes mask " + hex(b.dtypes) + " must be a non-empty set of BF16, F16");
  constexpr std::uint32_t kKv11 = MLAGATE_KV_AUTO | MLAGATE_KV_FP8 | MLAGATE_KV_FP8_E4M3 | MLAGATE_KV_FP8_DS_MLA;
  constexpr std::uint32_t kKv12 = kKv11 | MLAGATE_KV_FP8_V4;
  if (b.kv_cache_dtypes == 0 || (b.kv_cache_dtypes & ~(v12 ? kKv12 : kKv11)) != 0)
    refuse(path, who + ": kv_cache_dtypes mask " + hex(b.kv_cache_dtypes) +
                     " must be a non-empty set of AUTO, FP8, FP8_E4M3, FP8_DS_MLA" +
                     (v12 ? ", FP8_V4" : built + "; FP8_V4 needs ABI 1.2"));
  if ((b.graph_ops & ~MLAGATE_OP_DECODE) != 0 || (b.graph_ops & ~b.ops) != 0)
    refuse(path, who + ": graph_ops mask " + hex(b.graph_ops) + " must be 0 or DECODE, and an op of ops");
  if ((b.device.device_type != kDLCPU && b.device.device_type != kDLCUDA) || b.device.device_id < 0)
    refuse(path, who + ": device " + plugin::dl_device_str(b.device) + " (kDLCPU or kDLCUDA expected)");
  // 1.3: memory layouts (zero in older tables).
  if (b.strided_views > 1) refuse(path, who + ": strided_views must be 0 or 1");
  if (b.max_pool_bytes < 0) refuse(path, who + ": max_pool_bytes must be >= 0 (0: 2^31)");
}

std::mutex& loaded_mutex() {
  static std::mutex m;
  return m;
}
std::map<void*, std::weak_ptr<Library>>& loaded() {
  static std::map<void*, std::weak_ptr<Library>> m;
  return m;
}

std::shared_ptr<Library> open_library(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) refuse(path, "no such file");
  // A path, never a bare name: dlopen would search the library path instead.
  const std::string abs = fs::absolute(path, ec).string();
  dlerror();
  void* h = dlopen(abs.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (h == nullptr) {
    const char* e = dlerror();
    refuse(path, std::string("cannot load: ") + (e ? e : "dlopen failed"));
  }
  std::lock_guard<std::mutex> lock(loaded_mutex());
  if (auto it = loaded().find(h); it != loaded().end())
    if (auto lib = it->second.lock()) {
      dlclose(h);  // the earlier load holds its own reference
      return lib;
    }
  auto lib = std::make_shared<Library>(h, path);
  loaded()[h] = lib;
  return lib;
}

// Calls the entry point and checks the tables; sets the library's table.
void validate(Library& lib) {
  const std::string& path = lib.path();
  dlerror();
  void* sym = dlsym(lib.handle(), MLAGATE_PLUGIN_ENTRY_SYMBOL);
  if (sym == nullptr)
    refuse(path, "no symbol " MLAGATE_PLUGIN_ENTRY_SYMBOL
                 " (export it with MLAGATE_PLUGIN_EXPORT from mlagate/plugin.h, as extern \"C\" in C++)");
  mlagate_plugin_entry_fn entry = nullptr;
  static_assert(sizeof(entry) == sizeof(sym));
  std::memcpy(&entry, &sym, sizeof entry);
  const mlagate_plugin* t = nullptr;
  try {
    t = entry();
  } catch (const std::exception& e) {
    refuse(path, std::string("an exception escaped " MLAGATE_PLUGIN_ENTRY_SYMBOL "(): ") + e.what());
  } catch (...) {
    refuse(path, "an exception escaped " MLAGATE_PLUGIN_ENTRY_SYMBOL "()");
  }
  if (t == nullptr) refuse(path, MLAGATE_PLUGIN_ENTRY_SYMBOL "() returned NULL (the plugin refused to load)");
  // abi_version is the first member in every version: safe to read before anything else.
  if (t->abi_version != MLAGATE_PLUGIN_ABI_VERSION)
    refuse(path, "ABI version " + std::to_string(t->abi_version) + ", this mlagate speaks version " +
                     std::to_string(MLAGATE_PLUGIN_ABI_VERSION) +
                     " (rebuild the plugin against this mlagate's include/mlagate/plugin.h)");
  // The minor version and the stride of backends[]: a 1.0 table ends before
  // abi_minor; fields of a minor the plugin does not know are zero.
  if (t->struct_size < kPluginV10Size)
    refuse(path, "struct_size " + std::to_string(t->struct_size) + " < " + std::to_string(kPluginV10Size) +
                     " (the ABI 1.0 mlagate_plugin)");
  std::uint32_t minor = 0;
  std::size_t stride = kBackendV10Size;
  if (t->struct_size >= sizeof(mlagate_plugin)) {
    minor = t->abi_minor;
    // 0: a table built against a 1.1 header that left the field unset.
    stride = t->backend_struct_size != 0 ? t->backend_struct_size : sizeof(mlagate_backend);
  }
  // A minor far past any this header ever had is no minor: a table whose
  // newer fields were never set (a local or heap mlagate_plugin filled field
  // by field: its abi_minor holds whatever the memory held).
  constexpr std::uint32_t kNoSuchMinor = 64;
  if (minor > MLAGATE_PLUGIN_ABI_MINOR && minor >= kNoSuchMinor)
    refuse(path, "abi_minor " + std::to_string(minor) + " is no minor of ABI 1 (this mlagate's is " +
                     std::to_string(MLAGATE_PLUGIN_ABI_MINOR) +
                     "): the mlagate_plugin table looks uninitialized; make it static or zero it (= {0}) before "
                     "setting its fields, and set abi_minor = MLAGATE_PLUGIN_ABI_MINOR (include/mlagate/plugin.h)");
  if (minor > MLAGATE_PLUGIN_ABI_MINOR)
    refuse(path, "ABI version 1." + std::to_string(minor) + ", newer than this mlagate's 1." +
                     std::to_string(MLAGATE_PLUGIN_ABI_MINOR) + " (use a newer mlagate or build against this one's header)");
  if (stride < kBackendV10Size || stride > (1u << 16) || stride % alignof(mlagate_backend) != 0)
    refuse(path, "backend_struct_size " + std::to_string(stride) + " (at least " + std::to_string(kBackendV10Size) +
                     ", a multiple of " + std::to_string(alignof(mlagate_backend)) + ")");
  if (t->num_backends < 1 || t->num_backends > kMaxBackends || t->backends == nullptr)
    refuse(path, "num_backends " + std::to_string(t->num_backends) + " (1-" + std::to_string(kMaxBackends) +
                     " backends expected, backends non-NULL)");
  std::vector<mlagate_backend> backends(static_cast<std::size_t>(t->num_backends));
  for (int i = 0; i < t->num_backends; ++i) {
    mlagate_backend& b = backends[static_cast<std::size_t>(i)];
    std::memset(&b, 0, sizeof b);
    std::memcpy(&b, reinterpret_cast<const unsigned char*>(t->backends) + i * stride, std::min(stride, sizeof b));
    check_backend(path, i, b, minor);
  }
  for (int i = 0; i < t->num_backends; ++i)
    for (int j = 0; j < i; ++j)
      if (std::strcmp(backends[i].name, backends[j].name) == 0)
        refuse(path, "two backends are named '" + std::string(backends[i].name) + "'");
  lib.set_backends(std::move(backends));
}

}  // namespace

bool valid_backend_name(const std::string& s) {
  if (s.empty() || s.size() > kMaxNameBytes) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
           ch == '-';
  });
}

std::vector<BackendEntry> load_plugin(const std::string& path) {
  std::shared_ptr<Library> lib = open_library(path);
  if (lib->backends().empty()) validate(*lib);
  std::vector<BackendEntry> entries;
  for (const mlagate_backend& b : lib->backends()) {
    entries.emplace_back(b.name, BackendEntry::Make([lib, &b](const BackendOptions&) -> std::unique_ptr<Backend> {
                           return std::make_unique<PluginBackend>(lib, b);
                         }));
  }
  return entries;
}

}  // namespace mlagate
