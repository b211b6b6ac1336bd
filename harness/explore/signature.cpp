// failure_signature (signature.h): status, op, output and error pattern.
#include "harness/explore/signature.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <vector>

namespace mlagate {

namespace {

// A message without its numbers and ids: "worker killed by signal 11 (SIGSEGV)
// after 1.2 s" and the same at another shape read the same.
std::string shape_free(const std::string& msg) {
  std::string out;
  bool in_number = false;
  for (char ch : msg) {
    if (ch == '\n') break;
    if (std::isdigit(static_cast<unsigned char>(ch)) || (in_number && (ch == '.' || ch == 'e' || ch == '-'))) {
      if (!in_number) out += '#';
      in_number = true;
      continue;
    }
    in_number = false;
    out += ch;
  }
  if (out.size() > 90) out.resize(90);
  return out;
}

// "every" when all are bad, else "some": how many depends on the shape, which
// kind does not (one bug at 17 and at 22 heads is one finding).
std::string count_words(std::size_t bad, std::size_t all, const char* some, const char* every) {
  return bad >= all ? every : some;
}

}  // namespace

std::string error_pattern(const Metrics& m, const CaseSpec& spec) {
  if (m.map_tokens <= 0 || m.map_heads <= 0 || m.err_token_head.empty()) return "";
  const int rows = (m.map_tokens + m.token_bin - 1) / m.token_bin;
  const int cols = (m.map_heads + m.head_bin - 1) / m.head_bin;
  if (static_cast<std::size_t>(rows) * cols != m.err_token_head.size()) return "";
  float worst = 0;
  bool nonfinite = false;
  for (float e : m.err_token_head) {
    if (!std::isfinite(e)) nonfinite = true;
    else worst = std::max(worst, e);
  }
  // Bad cells: non-finite ones, or within a factor 4 of the largest error
  // (the cells a bug touches stand out; the rest is rounding).
  auto bad = [&](int row, int col) {
    const float e = m.err_token_head[static_cast<std::size_t>(row) * cols + col];
    return nonfinite ? !std::isfinite(e) : (worst > 0 && e >= worst / 4);
  };
  std::set<int> bad_cols, bad_rows;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      if (bad(i, j)) bad_cols.insert(j), bad_rows.insert(i);
  if (bad_rows.empty()) return "";
  const std::string heads = count_words(bad_cols.size(), static_cast<std::size_t>(cols), "some heads", "every head");
  // Token rows to requests (query_lens; tokens past their sum are padding).
  const std::vector<std::int32_t>& q = m.query_lens;
  if (q.empty()) return heads;
  std::vector<int> first(q.size() + 1, 0);
  for (std::size_t r = 0; r < q.size(); ++r) first[r + 1] = first[r] + q[r];
  std::set<int> bad_requests;
  bool padding = false, all_tails = true;
  for (int row : bad_rows) {
    const int t0 = row * m.token_bin, t1 = std::min(m.map_tokens, t0 + m.token_bin);
    for (int t = t0; t < t1; ++t) {
      const auto it = std::upper_bound(first.begin(), first.end(), t);
      const int r = static_cast<int>(it - first.begin()) - 1;
      if (r < 0 || r >= static_cast<int>(q.size())) {
        padding = true;
        continue;
      }
      bad_requests.insert(r);
    }
  }
  // A tail: within every bad request, its first token row is fine.
  for (int r : bad_requests) {
    const int row0 = first[r] / m.token_bin;
    if (q[r] < 2 * m.token_bin || bad_rows.count(row0)) all_tails = false;
  }
  std::size_t live = 0;  // requests with keys (padding requests have none)
  for (std::size_t r = 0; r < q.size() && r < spec.batch.seq_lens.size(); ++r) live += spec.batch.seq_lens[r] > 0;
  bool only_empty = !bad_requests.empty();
  for (int r : bad_requests)
    only_empty = only_empty && r < spec.num_requests() && spec.batch.seq_lens[static_cast<std::size_t>(r)] == 0;
  // The most specific thing that holds, one only (how many heads or requests
  // depends on the shape): padding, then heads, then tails, then requests.
  if (bad_requests.empty() && padding) return "padding rows";
  if (only_empty) return "padding requests (seq_len 0)";
  if (heads != "every head") return heads;
  if (all_tails && !bad_requests.empty()) return "the tail of a request";
  return count_words(bad_requests.size(), std::max<std::size_t>(live, 1), "some requests", "every request");
}

std::string failure_signature(const Record& r, const CaseSpec& spec) {
  std::string sig = std::string(status_name(r.status)) + " " + r.op;
  if (!r.mode.empty()) sig += " [" + r.mode + "]";
  if (r.status == Status::kIncorrect || r.status == Status::kNonfinite || r.status == Status::kNondeterministic ||
      r.status == Status::kBatchVariant) {
    // The output named: the first failing one that is not an lse (a bug in the
    // values shows in both, and which fails first would vary), else the lse.
    const Metrics* pick = nullptr;
    for (const Metrics& m : r.metrics)
      if (!m.passed && m.output != "quant_error" && (pick == nullptr || (pick->output == "lse" && m.output != "lse")))
        pick = &m;
    if (pick) {
      sig += " " + pick->output;
      const std::string where = error_pattern(*pick, spec);
      if (!where.empty()) return sig + ": " + where;
    }
    // No map to read (a wrong shape or dtype, a guard band): the message's words.
    return sig + ": " + shape_free(r.message);
  }
  return sig + ": " + shape_free(r.message);
}

}  // namespace mlagate
