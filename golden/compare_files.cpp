// compare A B: two results files, case by case, backend x op by backend x op,
// output by output: bit-identical, or how far apart (with the first worst
// element located), and the error against the reference each run measured.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "golden/compare_files.h"

#include "cases/format.h"

namespace mlagate {

namespace {

std::string fmt(double v) { return format_g(v, 6); }

// Position of a value on the dtype's number line (for ULP distances).
std::int64_t ordinal(const TensorView& v, std::int64_t i) {
  std::int64_t bits = 0, sign_bit = 0;
  switch (v.dtype) {
    case DType::kBF16:
    case DType::kF16: bits = static_cast<const std::uint16_t*>(v.data)[i]; sign_bit = 1 << 15; break;
    case DType::kF32: bits = static_cast<const std::uint32_t*>(v.data)[i]; sign_bit = std::int64_t{1} << 31; break;
    default: {
      std::uint64_t u;
      std::memcpy(&u, static_cast<const double*>(v.data) + i, 8);
      // Doubles: a coarse but monotone position (ULP counts saturate for far-apart values).
      const bool neg = u >> 63;
      const std::int64_t mag = static_cast<std::int64_t>(u & 0x7fffffffffffffffull) >> 1;
      return neg ? -mag : mag;
    }
  }
  return (bits & sign_bit) ? -(bits & (sign_bit - 1)) : bits;
}

struct OutputDiff {
  enum class Kind { kIdentical, kEqualValues, kWithin, kBeyond, kIncomparable } kind = Kind::kIdentical;
  std::string line;
};

OutputDiff diff_output(const StoredOutput& a, const StoredOutput& b, const std::vector<std::int32_t>& qsl,
                       const FileCompareOptions& opt) {
  OutputDiff d;
  const TensorView va = a.data.view(), vb = b.data.view();
  if (va.dtype != vb.dtype || va.shape != vb.shape) {
    d.kind = OutputDiff::Kind::kIncomparable;
    d.line = a.name + ": " + shape_str(va.shape) + " " + std::string(dtype_name(va.dtype)) + " vs " + shape_str(vb.shape) +
             " " + std::string(dtype_name(vb.dtype));
    return d;
  }
  if (a.data.nbytes() == b.data.nbytes() && std::memcmp(a.data.bytes(), b.data.bytes(), a.data.nbytes()) == 0) {
    d.line = a.name + ": bit-identical";
    return d;
  }
  std::int64_t differ = 0, beyond = 0, nonfinite = 0, worst = -1, max_ulp = 0;
  double max_abs = 0, max_rel = 0;
  for (std::int64_t i = 0; i < va.numel(); ++i) {
    const double x = va.get(i), y = vb.get(i);
    if ((std::isnan(x) && std::isnan(y)) || x == y) continue;  // NaN payloads and signed zeros: equal values
    ++differ;
    if (!std::isfinite(x) || !std::isfinite(y)) {
      ++nonfinite;
      ++beyond;
      if (worst < 0 || std::isfinite(max_abs)) worst = i, max_abs = std::numeric_limits<double>::infinity();
      continue;
    }
    const double e = std::fabs(x - y);
    if (e > opt.atol + opt.rtol * std::fabs(x)) ++beyond;
    if (e > max_abs || worst < 0) max_abs = e, worst = i;
    if (x != 0) max_rel = std::max(max_rel, e / std::fabs(x));
    max_ulp = std::max<std::int64_t>(max_ulp, std::llabs(ordinal(va, i) - ordinal(vb, i)));
  }
  if (differ == 0) {
    d.kind = OutputDiff::Kind::kEqualValues;
    d.line = a.name + ": equal values, different bits (signed zeros or NaN payloads)";
    return d;
  }
  d.kind = beyond > 0 ? OutputDiff::Kind::kBeyond : OutputDiff::Kind::kWithin;
  const Location loc = Layout{qsl, a.heads, a.dim}.locate(worst);
  d.line = a.name + ": " + std::to_string(differ) + " of " + std::to_string(va.numel()) + " elements differ, " +
           std::to_string(beyond) + " beyond atol=" + fmt(opt.atol) + " rtol=" + fmt(opt.rtol) + "; max abs " + fmt(max_abs) +
           " at " + loc.str() + " (" + fmt(va.get(worst)) + " vs " + fmt(vb.get(worst)) + ")";
  if (nonfinite) d.line += ", " + std::to_string(nonfinite) + " non-finite mismatches";
  if (va.dtype != DType::kF64) d.line += ", max " + std::to_string(max_ulp) + " ulp";
  d.line += ", max rel " + fmt(max_rel);
  if (!std::isnan(a.metrics.max_abs) || !std::isnan(b.metrics.max_abs))
    d.line += "; error vs golden " + fmt(a.metrics.max_abs) + " -> " + fmt(b.metrics.max_abs);
  return d;
}

}  // namespace

FileCompareSummary compare_results_files(const std::string& path_a, const std::string& path_b,
                                         const FileCompareOptions& opt, std::FILE* out) {
  GoldenReader a(path_a, opt.max_bytes / 2), b(path_b, opt.max_bytes / 2);
  for (GoldenReader* r : {&a, &b})
    if (r->info().kind != FileKind::kResults)
      throw GoldenFileError(r->path() + ": a golden file, not a results file (write one with run --save-results)");
  // Both files whole before the first line: a bad file is exit 2 with one
  // message, not a half-printed comparison.
  a.validate_all();
  b.validate_all();
  FileCompareSummary sum;
  auto line = [&](const char* tag, const std::string& backend, const std::string& op, const std::string& id) {
    std::fprintf(out, "%-16s %-12s %-7s %s\n", tag, backend.c_str(), op.c_str(), id.c_str());
  };
  std::set<std::string> in_b(b.case_ids().begin(), b.case_ids().end());
  std::vector<std::string> order = a.case_ids();
  for (const auto& id : b.case_ids())
    if (!a.has_case(id)) order.push_back(id);
  for (const std::string& id : order) {
    if (!a.has_case(id) || !in_b.count(id)) {
      const bool only_a = a.has_case(id);
      ++(only_a ? sum.only_a : sum.only_b);
      line(only_a ? "ONLY_IN_A" : "ONLY_IN_B", "-", "-", id);
      continue;
    }
    const CaseHeader ha = a.header(id), hb = b.header(id);
    // The FNV-1a hashes every file has; XXH64 ones where both files have them.
    const InputHashes& x = ha.hashes;
    const InputHashes& y = hb.hashes;
    const bool same_inputs = x.q == y.q && x.kv_c == y.kv_c && x.k_pe == y.k_pe && x.w_uk == y.w_uk && x.w_uv == y.w_uv &&
                             x.combined == y.combined && (!x.has_xxh || !y.has_xxh || x.xxh == y.xxh);
    if (ha.valid && hb.valid && !same_inputs) {
      ++sum.inputs_differ;
      line("INPUTS_DIFFER", "-", "-", id);
      std::fprintf(out, "  input_hash %s vs %s: the runs saw different inputs (generator or case definition changed)\n",
                   hash_hex(ha.hashes.combined).c_str(), hash_hex(hb.hashes.combined).c_str());
    }
    const std::vector<StoredResult> ra = a.load_results(id), rb = b.load_results(id);
    std::map<std::pair<std::string, std::string>, const StoredResult*> mb;
    for (const auto& r : rb) mb[{r.backend, r.op}] = &r;
    std::set<std::pair<std::string, std::string>> seen;
    for (const StoredResult& x : ra) {
      seen.insert({x.backend, x.op});
      auto it = mb.find({x.backend, x.op});
      if (it == mb.end()) {
        ++sum.only_a;
        line("ONLY_IN_A", x.backend, x.op, id);
        continue;
      }
      const StoredResult& y = *it->second;
      std::vector<std::string> details;
      OutputDiff::Kind worst = OutputDiff::Kind::kIdentical;
      bool missing = false;
      for (const StoredOutput& oa : x.outputs) {
        const StoredOutput* ob = nullptr;
        for (const auto& o : y.outputs)
          if (o.name == oa.name) ob = &o;
        if (!ob) {
          details.push_back(oa.name + ": only in A");
          missing = true;
          continue;
        }
        OutputDiff d = diff_output(oa, *ob, ha.query_start_loc, opt);
        worst = std::max(worst, d.kind);
        details.push_back(std::move(d.line));
      }
      for (const StoredOutput& ob : y.outputs) {
        bool found = false;
        for (const auto& o : x.outputs) found |= o.name == ob.name;
        if (!found) {
          details.push_back(ob.name + ": only in B");
          missing = true;
        }
      }
      if (x.status != y.status)
        details.push_back("status " + std::string(status_name(x.status)) + " -> " + std::string(status_name(y.status)));
      const char* tag = "IDENTICAL";
      if (worst == OutputDiff::Kind::kBeyond || worst == OutputDiff::Kind::kIncomparable || missing) {
        tag = "DIFFERENT";  // an output one run has and the other lacks (a crash) counts as a difference
        ++sum.different;
      } else if (worst == OutputDiff::Kind::kWithin || worst == OutputDiff::Kind::kEqualValues) {
        tag = "WITHIN_TOLERANCE";
        ++sum.within_tolerance;
      } else {
        ++sum.identical;
      }
      const bool show = opt.verbose || worst != OutputDiff::Kind::kIdentical || missing || x.status != y.status;
      if (show) {
        line(tag, x.backend, x.op, id);
        for (const auto& dl : details) std::fprintf(out, "  %s\n", dl.c_str());
      }
    }
    for (const StoredResult& y : rb)
      if (!seen.count({y.backend, y.op})) {
        ++sum.only_b;
        line("ONLY_IN_B", y.backend, y.op, id);
      }
  }
  const bool failed = sum.failed(opt);
  std::fprintf(out,
               "%s: %zu identical, %zu within tolerance (atol=%s, rtol=%s), %zu different, %zu only in A, %zu only in B%s\n",
               failed ? "DIFFERENT" : "SAME", sum.identical, sum.within_tolerance, fmt(opt.atol).c_str(),
               fmt(opt.rtol).c_str(), sum.different, sum.only_a, sum.only_b,
               sum.inputs_differ ? (", " + std::to_string(sum.inputs_differ) + " with different inputs").c_str() : "");
  return sum;
}

}  // namespace mlagate
