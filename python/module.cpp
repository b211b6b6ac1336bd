// The _mlagate extension module: the C++ core as the Python package `mlagate`
// sees it (mlagate/__init__.py wraps it; users never import _mlagate).
//   cases(argv)      -> [Case]: the selection of `mlagate run <argv>`, each case
//                       with its kernel-level inputs (DLPack tensors) and check()
//   cli_main(argv)   -> exit code: the CLI itself, in this process, with the
//                       backends set by set_backends() matched like plugins
//   set_backends, set_worker_command: Python backends and how workers load them
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <CLI/CLI.hpp>

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "cases/errors.h"
#include "harness/cli/cli.h"
#include "harness/cli/commands.h"
#include "harness/cli/options.h"
#include "harness/reliability/isolate.h"
#include "harness/run/runner.h"
#include "harness/verdicts/expectations.h"
#include "harness/verdicts/facts.h"
#include "mlagate/version.h"
#include "python/dlpack.h"
#include "python/py_backend.h"
#include "reports/report.h"

namespace mlagate::py {
namespace {

// What check() and inputs() share across the cases of one cases() call: the
// computation flags (policy, baseline, poison, reference) and one case stream,
// so that at most one case's inputs, references and caches are held at a time
// (entering another case frees the last one's, as in a CLI run).
struct Session {
  RunConfig cfg;
  // Held (with the GIL released) across entering a case and running on it:
  // threads that share the cases of one cases() call take turns.
  std::mutex mutex;
  std::unique_ptr<CaseStream> stream;
  const CaseSpec* current = nullptr;
  // The stream keeps the context when it is the same case's.
  CaseContext& enter(const CaseSpec& spec) {
    if (!stream) stream = std::make_unique<CaseStream>(cfg);
    current = nullptr;  // until enter() returns: it may throw, having left the last case
    CaseContext& ctx = stream->enter(spec);
    current = &spec;
    return ctx;
  }
};

std::vector<std::string> op_outputs(Op op) {
  if (op == Op::kDecode) return {"o_lat", "lse"};
  if (op == Op::kMergeStates) return {"output", "output_lse"};
  return {"o", "lse"};
}

Op kernel_op(const std::string& name) {
  const Op op = parse_op(name);
  if (op == Op::kLayer || op == Op::kCacheWrite)
    throw InputError("op '" + name + "': cases() gives the inputs of decode, prefill, sparse_decode, sparse_prefill and "
                     "merge_states; "
                     "check the layer op with mlagate.run and a backend that implements decode and prefill");
  return op;
}

// Capabilities that take any case: capture and replay run where the case is.
Capabilities any_case(int block_size) {
  Capabilities c;
  c.ops = {Op::kDecode, Op::kPrefill, Op::kSparseDecode, Op::kSparsePrefill, Op::kMergeStates};
  c.block_sizes = {block_size};
  c.query_len_support = QueryLenSupport::kVarlen;
  for (DType t : model_dtypes()) c.dtypes.push_back(t);
  c.dtypes.push_back(DType::kF32);  // a merge case's output may be fp32
  for (KvCacheDtype t : kv_cache_dtypes()) c.kv_dtypes.push_back(t);
  return c;
}

struct Captured : std::exception {
  const char* what() const noexcept override { return "inputs captured"; }
};

// Copies the arguments the runner hands a backend (the same code path as every
// backend's call) and stops the call there.
class CaptureBackend final : public Backend {
 public:
  explicit CaptureBackend(int bs) : caps_(any_case(bs)) {}
  std::string_view name() const override { return "capture"; }
  std::string_view description() const override { return "the inputs of a kernel-level op"; }
  Capabilities capabilities() const override { return caps_; }
  void decode(const DecodeArgs& a) override { keep([&] { return decode_args(a, Hold::kCopy); }); }
  void prefill(const PrefillArgs& a) override { keep([&] { return prefill_args(a, Hold::kCopy); }); }
  void sparse_decode(const SparseDecodeArgs& a) override { keep([&] { return sparse_decode_args(a, Hold::kCopy); }); }
  void sparse_prefill(const SparsePrefillArgs& a) override { keep([&] { return sparse_prefill_args(a, Hold::kCopy); }); }
  void merge_states(const MergeStatesArgs& a) override { keep([&] { return merge_states_args(a, Hold::kCopy); }); }
  pyb::object args;

 private:
  template <class F>
  void keep(F f) {
    {
      pyb::gil_scoped_acquire gil;
      args = f();
    }
    throw Captured();
  }
  Capabilities caps_;
};

// Writes outputs given from Python into the runner's output buffers: the
// record is then the CLI's, for exactly those outputs.
class ReplayBackend final : public Backend {
 public:
  ReplayBackend(int bs, std::string name, std::map<std::string, Tensor> outs)
      : caps_(any_case(bs)), name_(std::move(name)), outs_(std::move(outs)) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "outputs given to Case.check"; }
  Capabilities capabilities() const override { return caps_; }
  void decode(const DecodeArgs& a) override { put("o_lat", a.o_lat), put("lse", a.lse); }
  void prefill(const PrefillArgs& a) override { put("o", a.o), put("lse", a.lse); }
  void sparse_decode(const SparseDecodeArgs& a) override { put("o", a.o), put("lse", a.lse); }
  void sparse_prefill(const SparsePrefillArgs& a) override { put("o", a.o), put("lse", a.lse); }
  void merge_states(const MergeStatesArgs& a) override { put("output", a.output), put("output_lse", a.output_lse); }

 private:
  void put(const std::string& n, const TensorView& dst) {
    const Tensor& t = outs_.at(n);
    if (t.nbytes() != dst.nbytes()) throw WrongOutputError(n + ": size changed since the inputs were taken");
    std::memcpy(dst.data, t.bytes(), t.nbytes());
  }
  Capabilities caps_;
  std::string name_;
  std::map<std::string, Tensor> outs_;
};

class PyCase {
 public:
  PyCase(std::shared_ptr<Session> s, CaseSpec spec) : session_(std::move(s)), spec_(std::move(spec)) {}

  std::string id() const { return spec_.id(); }
  pyb::dict spec() const { return spec_dict(spec_); }

  // The first entry of these expectations files that selects this case run by
  // `backend` in `op` (harness/verdicts/VERDICTS.md), or None: the pytest
  // plugin marks the test xfail with it.
  pyb::object expected(const std::vector<std::string>& paths, const std::string& backend, const std::string& op_word,
                       int block_size) const {
    const ExpectationSet set = ExpectationSet::load(paths);
    Record r;
    r.case_id = spec_.id();
    r.backend = backend;
    r.op = std::string(op_name(parse_op(op_word)));
    r.block_size = effective_block_size(block_size);
    r.status = Status::kPassed;
    r.facts = record_facts(spec_, r, RunFacts{});
    for (const ExpectEntry& e : set.entries()) {
      if (!e.selects(r)) continue;
      pyb::dict d;
      d["id"] = e.id;
      d["reason"] = e.reason;
      d["link"] = e.link;
      d["strict"] = e.strict;
      std::vector<std::string> st;
      for (Status s : e.statuses) st.emplace_back(status_name(s));
      d["statuses"] = st;
      return std::move(d);
    }
    return pyb::none();
  }

  // The op's arguments as a backend gets them, with the block size given (0:
  // the case's, else 64). Copies, kept until release().
  pyb::object inputs(const std::string& op_word, int block_size) {
    const Op op = kernel_op(op_word);
    const int bs = effective_block_size(block_size);
    auto key = std::make_pair(op, bs);
    auto it = captured_.find(key);
    if (it == captured_.end()) {
      CaptureBackend cap(bs);
      Record r;
      {
        pyb::gil_scoped_release nogil;
        std::lock_guard lock(session_->mutex);
        CaseContext& ctx = session_->enter(spec_);
        r = run_one(ctx, cap, op, session_->cfg);
      }
      if (!cap.args || cap.args.is_none())
        throw pyb::value_error("case " + spec_.id() + ", op " + op_word + ": " + std::string(status_name(r.status)) +
                               ": " + r.message);
      it = captured_.emplace(key, cap.args).first;
    }
    // Every call gets outputs of its own, poisoned as the runner left them: a
    // kernel that writes nothing must not inherit an earlier call's results.
    pyb::dict fresh;
    for (auto item : pyb::reinterpret_borrow<pyb::dict>(it->second)) fresh[item.first] = item.second;
    for (const std::string& n : op_outputs(op)) {
      PyTensor t = PyTensor::copy_of(it->second[n.c_str()].template cast<PyTensor>().view);
      t.output = true;
      fresh[n.c_str()] = pyb::cast(std::move(t));
    }
    return fresh;
  }

  // The verdict of `outputs` (a mapping of output name to tensor) against
  // this case's reference, as the CLI's record (a JSON report holding it).
  std::string check(const std::string& op_word, const pyb::dict& outputs, int block_size, const std::string& name) {
    const Op op = kernel_op(op_word);
    const int bs = effective_block_size(block_size);
    pyb::dict args = pyb::reinterpret_borrow<pyb::dict>(inputs(op_word, block_size));
    std::map<std::string, Tensor> outs;
    for (const std::string& n : op_outputs(op)) {
      if (!outputs.contains(n.c_str()))
        throw pyb::key_error("check(" + op_word + "): outputs has no '" + n + "' (expected " + join_names(op) + ")");
      const PyTensor like = args[n.c_str()].cast<PyTensor>();
      outs.emplace(n, tensor_from_python(outputs[n.c_str()], like.view.dtype, like.view.shape, "output '" + n + "'"));
    }
    for (auto item : outputs) {
      const std::string k = pyb::str(item.first);
      bool known = false;
      for (const std::string& n : op_outputs(op)) known = known || k == n;
      if (!known) throw pyb::key_error("check(" + op_word + "): unknown output '" + k + "' (expected " + join_names(op) + ")");
    }
    ReplayBackend replay(bs, name, std::move(outs));
    Record r;
    {
      pyb::gil_scoped_release nogil;
      std::lock_guard lock(session_->mutex);
      CaseContext& ctx = session_->enter(spec_);
      r = run_one(ctx, replay, op, session_->cfg);
    }
    // The JSON report's form of the record, as mlagate.run's records are.
    std::ostringstream os;
    write_json(os, RunInfo{}, std::span<const Record>(&r, 1));
    return os.str();
  }

  void release() {
    captured_.clear();  // Python objects: with the GIL
    pyb::gil_scoped_release nogil;
    std::lock_guard lock(session_->mutex);
    if (session_->current == &spec_) {
      session_->stream.reset();
      session_->current = nullptr;
    }
  }

 private:
  int effective_block_size(int requested) const {
    if (spec_.block_size != 0) {
      if (requested != 0 && requested != spec_.block_size)
        throw pyb::value_error("case " + spec_.id() + " fixes block size " + std::to_string(spec_.block_size) +
                               ", not " + std::to_string(requested));
      return spec_.block_size;
    }
    if (requested < 0 || requested > 1024 || (requested & (requested - 1)) != 0)
      throw pyb::value_error("block_size " + std::to_string(requested) +
                             " is not a power of two in [1, 1024] (or 0: the case's, else 64)");
    return requested ? requested : 64;
  }
  static std::string join_names(Op op) {
    std::string s;
    for (const std::string& n : op_outputs(op)) s += (s.empty() ? "" : ", ") + n;
    return s;
  }
  std::shared_ptr<Session> session_;
  CaseSpec spec_;
  std::map<std::pair<Op, int>, pyb::object> captured_;
};

// argv (without the program name) parsed as `mlagate run`'s selection and
// computation flags.
std::vector<PyCase> cases(const std::vector<std::string>& words) {
  Selection sel;
  RunArgs ra;
  CLI::App app{"mlagate.cases"};
  sel.add_options(&app);
  ra.add_options(&app, false);
  std::vector<std::string> reversed(words.rbegin(), words.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw InputError(std::string("cases(): ") + e.what());
  }
  // What cases() does not do, it refuses rather than ignores.
  if (!ra.golden.empty() || !ra.shard.empty() || ra.order != "given" || ra.repeat > 1 || !ra.devices.empty())
    throw InputError("cases(): --golden, --shard, --order, --repeat and --devices belong to mlagate.run");
  auto session = std::make_shared<Session>();
  configure_computation(ra, session->cfg);
  const std::vector<CaseSpec> specs = ra.case_ids.empty() ? sel.resolve() : sel.resolve_ids(ra.case_ids);
  std::vector<PyCase> out;
  out.reserve(specs.size());
  for (const CaseSpec& s : specs) out.emplace_back(session, s);
  return out;
}

int run_cli(const std::vector<std::string>& words) {
  std::vector<std::string> args{"mlagate"};
  args.insert(args.end(), words.begin(), words.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pyb::gil_scoped_release nogil;
  return cli_main(static_cast<int>(args.size()), argv.data());
}

void set_backends(const pyb::list& decls) {
  std::vector<BackendEntry> entries;
  for (const pyb::handle& h : decls) {
    auto d = std::make_shared<PyBackendDecl>();
    d->name = h.attr("name").cast<std::string>();
    d->description = h.attr("description").cast<std::string>();
    d->caps = parse_capabilities(h.attr("ops").cast<std::vector<std::string>>(),
                                 h.attr("block_sizes").cast<std::vector<int>>(),
                                 h.attr("dtypes").cast<std::vector<std::string>>(),
                                 h.attr("kv_dtypes").cast<std::vector<std::string>>(),
                                 h.attr("query_len_support").cast<std::string>(),
                                 h.attr("reorder_threshold").cast<int>());
    // Layouts (cases/LAYOUTS.md): strided views handed as they are; pools past
    // the default 2^31 bytes where the backend says it addresses them.
    d->caps.strided_views = h.attr("strided_views").cast<bool>();
    if (!h.attr("max_pool_bytes").is_none()) d->caps.max_pool_bytes = h.attr("max_pool_bytes").cast<std::int64_t>();
    d->dispatch = h.attr("_dispatch");
    d->supports = h.attr("_supports");
    // --cuda-graph: only for backends declared capturable.
    d->capture = h.attr("cuda_graph").cast<bool>() ? pyb::object(h.attr("_capture_decode")) : pyb::object(pyb::none());
    entries.push_back(py_backend_entry(std::move(d)));
  }
  set_embedded_backends(std::move(entries));
}

}  // namespace
}  // namespace mlagate::py

PYBIND11_MODULE(_mlagate, m) {
  namespace pyb = pybind11;
  using namespace mlagate;
  using namespace mlagate::py;
  m.doc() = "mlagate's C++ core (use the mlagate package, not this module)";
  m.attr("__version__") = std::string(MLAGATE_VERSION);
  m.attr("git_commit") = std::string(MLAGATE_GIT_COMMIT);
  // Never destroyed: a static Python object outliving the interpreter would be
  // released after Py_Finalize.
  static auto* input_error = new pyb::exception<InputError>(m, "InputError", PyExc_ValueError);
  pyb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(input_error->ptr(), e.what());
    }
  });

  pyb::class_<PyTensor>(m, "Tensor", "a host tensor: zero-copy into torch (torch.from_dlpack) or numpy")
      .def_property_readonly("shape",
                             [](const PyTensor& t) {
                               pyb::tuple s(t.view.shape.size());
                               for (std::size_t i = 0; i < t.view.shape.size(); ++i) s[i] = pyb::int_(t.view.shape[i]);
                               return s;
                             })
      .def_property_readonly("dtype", [](const PyTensor& t) { return std::string(dtype_name(t.view.dtype)); })
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.view.nbytes(); })
      .def_property_readonly("is_output", [](const PyTensor& t) { return t.output; })
      .def_property_readonly("__array_interface__", &array_interface)
      .def("__dlpack__", [](const PyTensor& t, const pyb::object& stream) { return to_dlpack(t); },
           pyb::arg("stream") = pyb::none())
      .def("__dlpack_device__", [](const PyTensor&) { return pyb::make_tuple(1, 0); })
      .def("__repr__", [](const PyTensor& t) {
        return "mlagate.Tensor(" + std::string(dtype_name(t.view.dtype)) + ", " + shape_str(t.view.shape) +
               (t.output ? ", output" : "") + ")";
      });

  pyb::class_<PyCase>(m, "Case")
      .def_property_readonly("id", &PyCase::id)
      .def_property_readonly("spec", &PyCase::spec)
      .def("inputs", &PyCase::inputs, pyb::arg("op"), pyb::arg("block_size") = 0)
      .def("check", &PyCase::check, pyb::arg("op"), pyb::arg("outputs"), pyb::arg("block_size") = 0,
           pyb::arg("name") = "python")
      .def("expected", &PyCase::expected, pyb::arg("paths"), pyb::arg("backend") = "python", pyb::arg("op") = "decode",
           pyb::arg("block_size") = 0)
      .def("release", &PyCase::release);

  m.def("cases", &cases, pyb::arg("argv"));
  m.def("cli_main", &run_cli, pyb::arg("argv"));
  m.def("set_backends", &set_backends, pyb::arg("backends"));
  m.def("set_worker_command", &set_worker_command, pyb::arg("words"));
  m.def("worker_command", &worker_command);
  m.def("set_repro_command", &set_embedded_command, pyb::arg("words"));
  // An output written by Python (returned, or computed on the GPU or in numpy)
  // into the runner's buffer, with tensor_from_python's dtype and shape rules.
  m.def("copy_into", [](const PyTensor& dst, const pyb::handle& src, const std::string& what) {
    const Tensor t = tensor_from_python(src, dst.view.dtype, dst.view.shape, what);
    if (t.nbytes()) dst.view.unpack_from(t.bytes());  // into a strided view's elements only
  });
  m.def("op_outputs", [](const std::string& op) { return op_outputs(parse_op(op)); });
}
