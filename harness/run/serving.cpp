// ServingMode and run_serving (serving.h): the one place that dispatches to a
// mode (harness/run/modes/), and the lse base check the modes and the plain
// call's row checks share.
#include "harness/run/serving.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "harness/run/case_context.h"
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
  const auto not_supported = [&](std::string why) {
    Record r;
    r.case_id = ctx.c.spec.id();
    r.backend = std::string(b.name());
    r.op = std::string(op_name(op));
    r.policy = cfg.policy.describe();
    if (cfg.repro) r.repro = cfg.repro(ctx.c.spec, r.backend, op);
    r.mode = mode.name();
    r.status = Status::kNotSupported;
    r.message = std::move(why);
    return r;
  };
  if (!ctx.c.spec.layout.contiguous())
    // The modes' persistent buffers, padded batches and steps are contiguous
    // and fitted (a graph's persistent cache of a 4 GiB pool would be 4 GiB of
    // memory): a layout is the plain run's to check (cases/LAYOUTS.md).
    return not_supported("serving mode " + mode.name() + " runs the contiguous layout only (this case's: " +
                         layout_name(ctx.c.spec.layout) + ")");
  if (mode.get<modes::Dcp>()) {
    // A backend whose engine refuses decode context parallelism says why
    // (Capabilities::no_dcp); a case it takes in a plain run is then
    // NOT_SUPPORTED under --dcp with that reason, any other keeps its own.
    const std::string why = b.capabilities().no_dcp;
    if (!why.empty() && b.supports(ctx.c.spec, op).ok) return not_supported(why);
  }
  Record r = std::visit([&](const auto& m) { return m.run(ctx, b, op, cfg); }, mode.kind);
  r.mode = mode.name();
  return r;
}


}  // namespace mlagate
