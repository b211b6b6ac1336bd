// Repeat-and-compare (repeat.h). Outputs are captured through on_outputs, the
// hook run_one calls before freeing them, so the runs are exactly run_one's.
#include "harness/reliability/repeat.h"

#include <cstring>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cases/dtype.h"
#include "reports/profile.h"

namespace mlagate {

namespace {

struct Captured {
  std::string name;
  DType dtype;
  std::int64_t heads = 1, dim = 1;
  std::vector<std::byte> bytes;
};

// Where flat element i of an output [T, heads, dim] (or [T, heads * dim]) sits.
std::string where(const Captured& c, std::int64_t i) {
  std::ostringstream o;
  o << "element " << i << " (token " << i / (c.heads * c.dim) << ", head " << (i / c.dim) % c.heads << ", dim "
    << i % c.dim << ")";
  return o.str();
}

}  // namespace

Record run_repeated(CaseContext& ctx, Backend& b, Op op, const RunConfig& base, int repeat) {
  RunConfig cfg = base;
  std::vector<Captured>* sink = nullptr;
  std::vector<Captured> first;
  const std::vector<Captured>* first_sink = &first;
  cfg.on_outputs = [&](const Case& c, const Record& r, std::span<const ProducedOutput> outs) {
    if (sink == nullptr) return;
    // Results files (--save-results) get the first run's outputs.
    if (sink == first_sink && base.on_outputs) base.on_outputs(c, r, outs);
    for (const ProducedOutput& po : outs) {
      const TensorView v = po.buf.view();
      Captured cap{po.name, v.dtype, po.heads, po.dim, {}};
      cap.bytes.assign(static_cast<const std::byte*>(v.data), static_cast<const std::byte*>(v.data) + v.nbytes());
      sink->push_back(std::move(cap));
    }
  };
  sink = &first;
  Record r = run_one(ctx, b, op, cfg);
  // Nothing was produced (not supported, skipped, crashed): nothing to compare.
  if (repeat <= 1 || first.empty()) return r;
  int differing_runs = 0;
  std::string first_diff, verdicts;
  for (int k = 2; k <= repeat; ++k) {
    std::vector<Captured> again;
    sink = &again;
    const Record rk = run_one(ctx, b, op, cfg);
    accumulate(r.timings, rk.timings);  // the record's time is every run's
    bool differs = rk.status != r.status;
    std::string what;
    if (differs) what = "verdict " + std::string(status_name(rk.status)) + " instead of " + std::string(status_name(r.status));
    for (std::size_t o = 0; o < first.size() && o < again.size(); ++o) {
      const Captured& a = first[o];
      const Captured& bb = again[o];
      if (a.bytes.size() != bb.bytes.size()) {
        differs = true;
        what += (what.empty() ? "" : "; ") + a.name + ": size differs";
        continue;
      }
      const std::size_t esz = dtype_size(a.dtype);
      std::int64_t count = 0, at = -1;
      for (std::size_t i = 0; i < a.bytes.size(); i += esz)
        if (std::memcmp(a.bytes.data() + i, bb.bytes.data() + i, esz) != 0) {
          if (at < 0) at = static_cast<std::int64_t>(i / esz);
          ++count;
        }
      if (count > 0) {
        differs = true;
        const TensorView va{a.dtype, {static_cast<std::int64_t>(a.bytes.size() / esz)}, const_cast<std::byte*>(a.bytes.data())};
        const TensorView vb{a.dtype, {static_cast<std::int64_t>(a.bytes.size() / esz)}, const_cast<std::byte*>(bb.bytes.data())};
        std::ostringstream m;
        m.precision(9);
        m << a.name << ": " << count << " of " << a.bytes.size() / esz << " elements differ, first at " << where(a, at)
          << ": " << va.get(at) << " (run 1) vs " << vb.get(at) << " (run " << k << ")";
        what += (what.empty() ? "" : "; ") + m.str();
      }
    }
    if (first.size() != again.size()) {
      differs = true;
      what += (what.empty() ? "" : "; ") + std::string("a different set of outputs");
    }
    if (differs) {
      ++differing_runs;
      if (first_diff.empty()) first_diff = "run " + std::to_string(k) + ": " + what;
      verdicts += "run " + std::to_string(k) + ": " + what + "\n";
    }
  }
  if (differing_runs == 0) return r;
  Record nd = r;
  nd.status = Status::kNondeterministic;
  nd.message = std::to_string(differing_runs) + " of " + std::to_string(repeat - 1) +
               " repeated runs differ from run 1; first: " + first_diff;
  nd.details = "run 1 verdict: " + std::string(status_name(r.status)) + (r.message.empty() ? "" : " (" + r.message + ")") +
               "\n" + verdicts;
  return nd;
}

}  // namespace mlagate
