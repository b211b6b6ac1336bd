// record_facts (facts.h): a record's case parameters and run settings as words.
#include "harness/verdicts/facts.h"

#include <algorithm>
#include <array>
#include <limits>

#include "cases/dtype.h"
#include "cases/encoding.h"

namespace mlagate {

namespace {

constexpr std::array kFactKeys = {
    FactKey{"suite", FactKind::kWord, "the case's suite"},
    FactKey{"spec", FactKind::kWord, "the batch spec's name"},
    FactKey{"tp", FactKind::kNumber, "tensor-parallel size"},
    FactKey{"heads", FactKind::kNumber, "heads on this rank (total_heads / tp)"},
    FactKey{"total_heads", FactKind::kNumber, "heads of the model"},
    FactKey{"dtype", FactKind::kWord, "model dtype: bf16, fp16 (fp32: merge cases)"},
    FactKey{"dims", FactKind::kWord, "MLA dims: deepseek, glm, v4, nope or L.R.P.V"},
    FactKey{"kv", FactKind::kWord, "kv cache dtype: auto, fp8, fp8_e4m3, fp8_ds_mla, fp8_v4"},
    FactKey{"kv_format", FactKind::kWord, "kv cache format with its scale rule: fp8_ds_mla:raw"},
    FactKey{"k_scale", FactKind::kNumber, "the per-tensor cache scale"},
    FactKey{"kscale_exact", FactKind::kBool, "true when k_scale is exact in the model dtype (bf16 0.01 is not)"},
    FactKey{"block_size", FactKind::kNumber, "the block size the record ran with"},
    FactKey{"seed", FactKind::kNumber, "the case's seed"},
    FactKey{"q_magnitude", FactKind::kNumber, "q drawn N(0, q_magnitude^2)"},
    FactKey{"query_kind", FactKind::kWord, "decode, prefill, spec_decode, mixed or merge"},
    FactKey{"requests", FactKind::kNumber, "requests in the batch"},
    FactKey{"query_len_min", FactKind::kNumber, "the shortest query of a request"},
    FactKey{"query_len_max", FactKind::kNumber, "the longest query of a request"},
    FactKey{"seq_len_min", FactKind::kNumber, "the shortest sequence (context + query)"},
    FactKey{"seq_len_max", FactKind::kNumber, "the longest sequence"},
    FactKey{"tokens", FactKind::kNumber, "query tokens in all"},
    FactKey{"keys", FactKind::kNumber, "keys (sequence tokens) in all"},
    FactKey{"padding", FactKind::kBool, "true when a request has seq_len 0"},
    FactKey{"partial_block", FactKind::kBool,
            "true when a request's last block is partly filled (a seq_len not a multiple of the block size)"},
    FactKey{"query_rows_max", FactKind::kNumber, "query_len_max x heads: a decode kernel's query rows per kv head"},
    FactKey{"topk", FactKind::kNumber, "sparse: index slots per token (0: dense)"},
    FactKey{"window", FactKind::kNumber, "sparse V4: sliding window (0: none)"},
    FactKey{"index_pattern", FactKind::kWord, "sparse: random, dup, invalid_rows, lens, oob"},
    FactKey{"sink", FactKind::kBool, "sparse: true with an attention sink"},
    FactKey{"lse_pattern", FactKind::kWord, "merge_states: ordinary, prefix_empty, ..., mixed"},
    FactKey{"mode", FactKind::kWord, "serving mode: plain, cuda-graph, batch-invariance, dcp=..., steps=..."},
    FactKey{"poison", FactKind::kWord, "--poison: nan, sentinel, zero, none"},
    FactKey{"reference", FactKind::kWord, "--reference: eigen, cuda"},
    FactKey{"splits", FactKind::kNumber, "--splits (0: the backend's choice)"},
    FactKey{"repeat", FactKind::kNumber, "runs compared bitwise per record (--repeat, or the suite's)"},
};

std::string yes_no(bool b) { return b ? "true" : "false"; }

}  // namespace

std::span<const FactKey> fact_keys() { return kFactKeys; }

const FactKey* find_fact_key(std::string_view name) {
  for (const FactKey& k : kFactKeys)
    if (k.name == name) return &k;
  return nullptr;
}

bool k_scale_exact_in_model_dtype(const CaseSpec& c) {
  if (c.dtype != DType::kBF16 && c.dtype != DType::kF16) return true;
  return round_to_16bit(c.k_scale, c.dtype == DType::kBF16) == c.k_scale;
}

std::string query_kind(const CaseSpec& c) {
  if (c.merge.active()) return "merge";
  if (c.batch.spec_decode) return "spec_decode";
  bool decode = true, prefill = true;
  for (int i = 0; i < c.num_requests(); ++i) {
    const int q = c.batch.query_lens[static_cast<std::size_t>(i)], s = c.batch.seq_lens[static_cast<std::size_t>(i)];
    decode = decode && q <= 1;
    prefill = prefill && s == q;
  }
  if (decode) return "decode";
  return prefill ? "prefill" : "mixed";
}

std::string failing_outputs_kind(const Record& r) {
  bool values = false, lse = false;
  for (const Metrics& m : r.metrics) {
    if (m.passed || m.output == "quant_error") continue;
    (m.output == "lse" ? lse : values) = true;
  }
  return values ? "values" : lse ? "lse" : "none";
}

std::string scale_class(const std::map<std::string, std::string>& facts) {
  const auto kv = facts.find("kv");
  const auto ex = facts.find("kscale_exact");
  const bool per_tensor = kv != facts.end() && (kv->second == "fp8" || kv->second == "fp8_e4m3");
  return per_tensor && ex != facts.end() && ex->second == "false" ? "k_scale inexact" : "k_scale exact or none";
}

std::map<std::string, std::string> record_facts(const CaseSpec& c, const Record& r, const RunFacts& run) {
  std::map<std::string, std::string> f;
  f["suite"] = c.suite;
  f["spec"] = c.batch.name;
  f["tp"] = std::to_string(c.tp);
  f["heads"] = std::to_string(c.num_heads());
  f["total_heads"] = std::to_string(c.total_heads);
  f["dtype"] = std::string(dtype_short(c.dtype));
  f["dims"] = dims_label(c.dims);
  f["kv"] = std::string(kv_cache_dtype_name(c.kv_cache_dtype));
  f["kv_format"] = kv_cache_format_name(c.kv_format());
  f["k_scale"] = exact_number(static_cast<double>(c.k_scale));
  f["kscale_exact"] = yes_no(k_scale_exact_in_model_dtype(c));
  const int bs = r.block_size > 0 ? r.block_size : c.block_size;
  f["block_size"] = bs > 0 ? std::to_string(bs) : "auto";
  f["seed"] = std::to_string(c.seed);
  f["q_magnitude"] = exact_number(c.q_magnitude);
  f["query_kind"] = query_kind(c);
  const std::vector<int>& q = c.batch.query_lens;
  const std::vector<int>& s = c.batch.seq_lens;
  f["requests"] = std::to_string(c.num_requests());
  if (!q.empty()) {
    f["query_len_min"] = std::to_string(*std::min_element(q.begin(), q.end()));
    f["query_len_max"] = std::to_string(*std::max_element(q.begin(), q.end()));
    f["seq_len_min"] = std::to_string(*std::min_element(s.begin(), s.end()));
    f["seq_len_max"] = std::to_string(*std::max_element(s.begin(), s.end()));
  }
  f["tokens"] = std::to_string(c.num_tokens());
  f["keys"] = std::to_string(c.num_kv_tokens());
  f["padding"] = yes_no(std::find(s.begin(), s.end(), 0) != s.end());
  if (bs > 0 && !c.merge.active())
    f["partial_block"] = yes_no(std::any_of(s.begin(), s.end(), [bs](int v) { return v > 0 && v % bs != 0; }));
  if (!q.empty())
    f["query_rows_max"] = std::to_string(static_cast<long long>(*std::max_element(q.begin(), q.end())) * c.num_heads());
  f["topk"] = std::to_string(c.sparse.topk);
  f["window"] = std::to_string(c.sparse.window);
  if (c.sparse.active()) {
    f["index_pattern"] = std::string(index_pattern_name(c.sparse.pattern));
    f["sink"] = yes_no(c.sparse.sink);
  }
  if (c.merge.active()) f["lse_pattern"] = std::string(lse_pattern_name(c.merge.lse));
  f["mode"] = r.mode.empty() ? "plain" : r.mode;
  f["poison"] = run.poison;
  f["reference"] = run.reference;
  f["splits"] = std::to_string(run.splits);
  f["repeat"] = std::to_string(run.repeat);
  return f;
}

}  // namespace mlagate
