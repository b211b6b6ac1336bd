// ServingMode and run_serving (serving.h): the one place that dispatches to a
// mode (harness/run/modes/), and the lse base check the modes and the plain
// call's row checks share.
#include "harness/run/serving.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "cases/errors.h"

namespace mlagate {

std::string ServingMode::name() const {
  return std::visit([](const auto& m) { return m.name(); }, kind);
}

bool ServingMode::takes(Op op) const {
  return std::visit([op](const auto& m) { return m.takes(op); }, kind);
}

void ServingMode::validate() const {
  std::visit([](const auto& m) { m.validate(); }, kind);
}

std::vector<Op> ServingMode::ops(bool auto_ops, const std::vector<Op>& asked, const std::vector<CaseSpec>& cases) const {
  if (auto_ops) {
    bool dense = false, sparse = false;
    for (const CaseSpec& c : cases) (c.sparse.active() ? sparse : dense) = true;
    std::vector<Op> out;
    if (dense || !sparse) out.push_back(Op::kDecode);
    if (sparse) out.push_back(Op::kSparseDecode);
    return out;
  }
  for (Op op : asked)
    if (!takes(op))
      throw InputError(name() + " runs the kernel-level decode or sparse_decode op: pass --op decode or sparse_decode "
                                "(or leave --op out)");
  return asked;
}

Record run_serving(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, const ServingMode& mode) {
  if (!mode.takes(op)) throw std::logic_error(mode.name() + " does not run the " + std::string(op_name(op)) + " op");
  Record r = std::visit([&](const auto& m) { return m.run(ctx, b, op, cfg); }, mode.kind);
  r.mode = mode.name();
  return r;
}

std::string lse_base_hint(const TensorView& got, const std::vector<double>& reference) {
  // The mean abs deviation of got and of got * ln 2 from the reference, over rows where both are finite.
  double dev_e = 0, dev_2 = 0;
  std::int64_t n = 0;
  const std::int64_t total = std::min<std::int64_t>(got.numel(), static_cast<std::int64_t>(reference.size()));
  for (std::int64_t i = 0; i < total; ++i) {
    const double g = got.get(i), y = reference[static_cast<std::size_t>(i)];
    if (!std::isfinite(g) || !std::isfinite(y) || std::abs(y) < 0.5) continue;  // near 0 both bases agree
    dev_e += std::abs(g - y);
    dev_2 += std::abs(g * std::log(2.0) - y);
    ++n;
  }
  if (n == 0 || !(dev_2 * 10 < dev_e)) return {};
  std::ostringstream m;
  m.precision(3);
  m << "the lse is base 2 (log2): lse x ln 2 matches the natural-log reference (mean abs dev " << dev_2 / n
    << " against " << dev_e / n << " as given)";
  return m.str();
}

}  // namespace mlagate
