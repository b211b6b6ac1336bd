// CaseSpec: validation, derived sizes and the stable id string.
#include "cases/case_spec.h"

#include <cmath>
#include <cstdio>
#include <numeric>

#include "cases/errors.h"

namespace mlagate {

namespace {

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// Upper bound on elements of any one tensor: keeps an absurd case from
// exhausting memory before anything runs.
constexpr double kMaxElements = 4.0e9;

}  // namespace

Dims dims_preset(const std::string& name) {
  if (name == "deepseek") return Dims{};
  if (name == "glm") return Dims{512, 64, 192, 256};
  throw InputError("unknown dims preset '" + name + "' (expected deepseek or glm)");
}

std::string dims_label(const Dims& d) {
  if (d == Dims{}) return "deepseek";
  if (d == Dims{512, 64, 192, 256}) return "glm";
  return std::to_string(d.kv_lora_rank) + "." + std::to_string(d.rope_dim) + "." +
         std::to_string(d.nope_dim) + "." + std::to_string(d.v_head_dim);
}

double CaseSpec::softmax_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(dims.head_size()));
}

int CaseSpec::num_tokens() const { return std::accumulate(batch.query_lens.begin(), batch.query_lens.end(), 0); }
int CaseSpec::num_kv_tokens() const { return std::accumulate(batch.seq_lens.begin(), batch.seq_lens.end(), 0); }

std::string CaseSpec::id() const {
  std::string s = suite + "/" + batch.name + "/tp" + std::to_string(tp) + "/" + std::string(dtype_short(dtype)) +
                  "/kv=" + kv_cache_format_name(kv_format()) + "/bs=" +
                  (block_size == 0 ? std::string("auto") : std::to_string(block_size)) + "/seed=" + std::to_string(seed);
  if (!(dims == Dims{})) s += "/dims=" + dims_label(dims);
  if (total_heads != 128) s += "/heads=" + std::to_string(total_heads);
  if (q_magnitude != 1.0) s += "/qmag=" + fmt_double(q_magnitude);
  if (scale) s += "/scale=" + fmt_double(*scale);
  if (k_scale != 1.0f) s += "/kscale=" + fmt_double(k_scale);
  return s;
}

void CaseSpec::validate() const {
  auto fail = [&](const std::string& why) { throw InvalidCase(batch.name + ": " + why); };
  if (batch.name.empty()) fail("batch spec has no name");
  if (batch.seq_lens.empty()) fail("batch has no requests");
  if (batch.seq_lens.size() != batch.query_lens.size())
    fail("seq_lens has " + std::to_string(batch.seq_lens.size()) + " entries but query_lens has " +
         std::to_string(batch.query_lens.size()));
  double total_t = 0, total_s = 0;
  for (std::size_t i = 0; i < batch.seq_lens.size(); ++i) {
    const int s = batch.seq_lens[i], q = batch.query_lens[i];
    const std::string req = "request " + std::to_string(i);
    if (s < 0) fail(req + ": negative seq_len " + std::to_string(s));
    if (q < 1) fail(req + ": query_len " + std::to_string(q) + " < 1");
    // A seq_len 0 request is CUDA-graph padding: its query tokens see no key.
    if (s > 0 && q > s) fail(req + ": query_len " + std::to_string(q) + " > seq_len " + std::to_string(s));
    total_t += q;
    total_s += s;
  }
  const int L = dims.kv_lora_rank, R = dims.rope_dim, P = dims.nope_dim, V = dims.v_head_dim;
  if (L < 1 || R < 0 || P < 1 || V < 1 || L > 16384 || R > 4096 || P > 4096 || V > 4096)
    fail("dims out of range: L=" + std::to_string(L) + " R=" + std::to_string(R) + " P=" + std::to_string(P) +
         " V=" + std::to_string(V));
  if (total_heads < 1 || tp < 1) fail("heads and tp must be positive");
  if (total_heads % tp != 0)
    fail("total heads " + std::to_string(total_heads) + " not divisible by tp " + std::to_string(tp));
  if (dtype != DType::kBF16 && dtype != DType::kF16) fail("model dtype must be bf16 or fp16");
  if (block_size != 0 && (block_size < 1 || block_size > 1024 || (block_size & (block_size - 1)) != 0))
    fail("block size " + std::to_string(block_size) + " is not a power of two in [1, 1024]");
  if (!(q_magnitude > 0) || !std::isfinite(q_magnitude)) fail("q magnitude must be positive and finite");
  if (scale && (!(*scale > 0) || !std::isfinite(*scale))) fail("scale must be positive and finite");
  if (!(k_scale > 0) || !std::isfinite(k_scale)) fail("k_scale must be positive and finite");
  if (scale_rule != ScaleRule::kPow2 && kv_cache_dtype != KvCacheDtype::kFp8DsMla)
    fail("scale rule " + std::string(scale_rule_name(scale_rule)) + " applies to fp8_ds_mla caches only");
  if (kv_cache_dtype == KvCacheDtype::kFp8DsMla) {
    // The entry quantizes the latent in tiles of 128 and stores the RoPE part as bf16 verbatim.
    if (L % 128 != 0) fail("fp8_ds_mla needs kv_lora_rank a multiple of 128, got " + std::to_string(L));
    if (dtype != DType::kBF16) fail("fp8_ds_mla stores RoPE as bf16 verbatim: the model dtype must be bf16");
  }
  const double n = num_heads();
  if (total_t * n * (P + R) > kMaxElements || total_s * (L + R) > kMaxElements || double(L) * n * (P + V) > kMaxElements)
    fail("case too large (more than 4e9 elements in one tensor)");
}

}  // namespace mlagate
