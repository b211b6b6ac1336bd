// Reading a results file's records: golden/detail/results_reader.h.
#include "golden/detail/results_reader.h"

#include <string>

#include "golden/detail/h5.h"
#include "golden/detail/schema.h"

namespace mlagate::golden {

namespace {

using io::bad;
using io::Where;

DType parse_dtype_name(const std::string& s, const Where& w) {
  for (DType d : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8})
    if (s == dtype_name(d)) return d;
  bad(w, "unknown dtype '" + s + "'");
}

Status parse_status_name(const std::string& s, const Where& w) {
  for (Status st : kAllStatuses)
    if (s == status_name(st)) return st;
  bad(w, "unknown status '" + s + "'");
}

}  // namespace

std::vector<StoredResult> read_results(hid_t g, const Where& w, const CaseHeader& h, io::Budget& budget) {
  std::vector<StoredResult> out;
  if (!io::has_link(g, schema::kResultsGroup, w)) return out;
  const h5::Group rg = io::open_group(g, schema::kResultsGroup, w);
  const Where wr = w / schema::kResultsGroup;
  for (const std::string& backend : io::list_group(rg.get(), wr, 10000)) {
    const h5::Group bg = io::open_group(rg.get(), backend, wr);
    const Where wb = wr / backend;
    for (const std::string& op : io::list_group(bg.get(), wb, 16)) {
      bool known = false;
      for (Op o : all_ops()) known = known || op == op_name(o);
      if (!known) bad(wb, "unknown op '" + op + "'");
      const h5::Group og = io::open_group(bg.get(), op, wb);
      const Where wo = wb / op;
      StoredResult r;
      r.backend = backend;
      r.op = op;
      r.status = parse_status_name(io::read_string(og.get(), "status", wo, 64), wo);
      r.message = io::read_string(og.get(), "message", wo);
      r.policy = io::read_string(og.get(), "policy", wo, 1024);
      r.repro = io::read_string(og.get(), "repro", wo);
      r.block_size = static_cast<int>(io::read_int(og.get(), "block_size", wo, 0, 1024));
      for (const std::string& name : io::list_group(og.get(), wo, 16)) {
        schema::OutputShape os;
        if (!h.valid || !schema::output_shape(h.spec, op, name, os)) bad(wo, "unexpected output '" + name + "'");
        const DType dt = parse_dtype_name(io::dataset_dtype_attr(og.get(), name, wo), wo / name);
        if (dt != DType::kBF16 && dt != DType::kF16 && dt != DType::kF32 && dt != DType::kF64)
          bad(wo / name, "outputs are floating point");
        StoredOutput so;
        so.name = name;
        so.heads = os.heads;
        so.dim = os.dim;
        so.data = io::read_tensor(og.get(), name, dt, os.shape, wo, budget);
        const h5::Dataset ds = h5::dopen(og.get(), name, (wo / name).str());
        const Where wd = wo / name;
        const hid_t d = ds.get();
        Metrics& mt = so.metrics;
        mt.output = name;
        mt.numel = so.data.numel();
        auto opt_double = [&](const char* key, double& v) {
          if (io::has_attr(d, key, wd)) v = io::read_double(d, key, wd);
        };
        opt_double("max_abs", mt.max_abs);
        opt_double("max_rel", mt.max_rel);
        opt_double("rel_floor", mt.rel_floor);
        opt_double("mean_abs", mt.mean_abs);
        opt_double("nmse", mt.nmse);
        opt_double("cos_diff", mt.cos_diff);
        opt_double("max_ulp", mt.max_ulp);
        opt_double("ref_norm", mt.ref_norm);
        opt_double("out_norm", mt.out_norm);
        opt_double("min_atol", mt.min_atol);
        if (io::has_attr(d, "passed", wd)) mt.passed = io::read_int(d, "passed", wd, 0, 1) == 1;
        if (io::has_attr(d, "message", wd)) mt.message = io::read_string(d, "message", wd);
        r.outputs.push_back(std::move(so));
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace mlagate::golden
