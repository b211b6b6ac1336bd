// Every op's module, one line each: the one list the runner, the case stream
// and golden adoption go through. Adding an op: its module, and a line here.
#include <stdexcept>
#include <string>

#include "harness/run/ops/driver.h"

namespace mlagate {

const OpDriver& decode_driver();          // ops/decode
const OpDriver& prefill_driver();         // ops/prefill
const OpDriver& layer_driver();           // ops/layer
const OpDriver& cache_write_driver();     // ops/cache_write
const OpDriver& sparse_decode_driver();   // ops/sparse
const OpDriver& sparse_prefill_driver();  // ops/sparse
const OpDriver& merge_driver();           // ops/merge

const std::vector<const OpDriver*>& op_drivers() {
  static const std::vector<const OpDriver*> all = {
      &decode_driver(),        &prefill_driver(),        &layer_driver(), &cache_write_driver(),
      &sparse_decode_driver(), &sparse_prefill_driver(), &merge_driver(),
  };
  return all;
}

const OpDriver& op_driver(Op op) {
  for (const OpDriver* d : op_drivers())
    if (d->op() == op) return *d;
  throw std::logic_error("no module for op " + std::string(op_name(op)));
}

void AheadPlan::add(std::vector<Task>& to, std::string key, std::function<void(CaseContext&)> work) {
  if (!has(to, key)) to.push_back(Task{std::move(key), std::move(work)});
}

bool AheadPlan::has(const std::vector<Task>& in, const std::string& key) const {
  for (const Task& t : in)
    if (t.key == key) return true;
  return false;
}

}  // namespace mlagate
