// CaseSpec: validation, derived sizes and the stable id string.
#include "cases/case_spec.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cases/errors.h"
#include "cases/format.h"

namespace mlagate {

namespace {

std::string fmt_double(double v) { return format_g(v, 10); }

// Upper bound on elements of any one tensor: keeps an absurd case from
// exhausting memory before anything runs.
constexpr double kMaxElements = 4.0e9;

}  // namespace

Dims dims_preset(const std::string& name) {
  if (name == "deepseek") return Dims{};
  if (name == "glm") return Dims{512, 64, 192, 256};
  // DeepSeek V4: a 512-wide entry of 448 NoPE + 64 RoPE (P and V only shape the
  // absorbed queries; the sparse ops return the whole entry).
  if (name == "v4") return Dims{448, 64, 128, 128};
  // NoPE MLA (GLM-5.3-Flash, vLLM's FLASHINFER_MLA_SPARSE_SM90 with head size
  // 512 and kpe 0): the latent alone, no rotary part (R = 0). P and V are
  // GLM's; only prefill and the layer's up-projections use them.
  if (name == "nope") return Dims{512, 0, 192, 256};
  // "L.R.P.V", dims_label's form for dims that are no preset (shrunk or drawn
  // cases written back as suite files); validate() bounds the values.
  int l = 0, r = 0, p = 0, v = 0;
  char extra = 0;
  if (std::sscanf(name.c_str(), "%d.%d.%d.%d%c", &l, &r, &p, &v, &extra) == 4 && l > 0 && r >= 0 && p > 0 && v > 0)
    return Dims{l, r, p, v};
  throw InputError("unknown dims preset '" + name + "' (expected deepseek, glm, v4, nope or L.R.P.V such as 256.32.64.64)");
}

std::string dims_label(const Dims& d) {
  if (d == Dims{}) return "deepseek";
  if (d == Dims{512, 64, 192, 256}) return "glm";
  if (d == Dims{448, 64, 128, 128}) return "v4";
  if (d == Dims{512, 0, 192, 256}) return "nope";
  return std::to_string(d.kv_lora_rank) + "." + std::to_string(d.rope_dim) + "." +
         std::to_string(d.nope_dim) + "." + std::to_string(d.v_head_dim);
}

double CaseSpec::softmax_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(dims.head_size()));
}

bool CaseSpec::takes(Op op) const { return ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end(); }

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
  if (reference_k_scale_rounded) s += "/refkscale=model";
  if (sparse.topk > 0) s += "/topk=" + std::to_string(sparse.topk);
  if (sparse.window > 0) s += "/win=" + std::to_string(sparse.window);
  if (sparse.compress > 0) s += "/cmp=" + std::to_string(sparse.compress) + "x" + std::to_string(sparse.extra_topk);
  if (sparse.active() && sparse.pattern != IndexPattern::kRandom) s += "/idx=" + std::string(index_pattern_name(sparse.pattern));
  if (sparse.sink) s += "/sink";
  if (!layout.contiguous()) s += "/layout=" + layout_name(layout);
  if (merge.active()) {
    s += "/merge=d" + std::to_string(merge.head_dim) + "/lse=" + std::string(lse_pattern_name(merge.lse));
    if (merge.gap != 0) s += "/gap=" + fmt_double(merge.gap);
  }
  return s;
}

std::int64_t LayoutSpec::pool_floor_bytes() const {
  switch (pool) {
    case PoolSize::kFitted: return 0;
    case PoolSize::k2G: return std::int64_t{1} << 31;
    case PoolSize::k4G: return std::int64_t{1} << 32;
  }
  return 0;
}

std::string layout_name(const LayoutSpec& l) {
  if (l.contiguous()) return "contiguous";
  std::string s;
  auto add = [&](const char* part) { s += (s.empty() ? "" : "+") + std::string(part); };
  if (l.strided) add("strided");
  if (l.shared) add("shared");
  if (l.pool == PoolSize::k2G) add("pool2g");
  if (l.pool == PoolSize::k4G) add("pool4g");
  return s;
}

LayoutSpec parse_layout(std::string_view s) {
  LayoutSpec l;
  if (s == "contiguous") return l;
  const auto bad = [&](const std::string& why) {
    return InputError("layout '" + std::string(s) + "': " + why +
                      " (expected contiguous, or strided, shared, pool2g, pool4g joined by '+')");
  };
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t plus = std::min(s.find('+', at), s.size());
    const std::string_view part = s.substr(at, plus - at);
    if (part == "strided" && !l.strided) l.strided = true;
    else if (part == "shared" && !l.shared) l.shared = true;
    else if ((part == "pool2g" || part == "pool4g") && l.pool == PoolSize::kFitted)
      l.pool = part == "pool2g" ? PoolSize::k2G : PoolSize::k4G;
    else throw bad(part.empty() ? "an empty part" : "unknown or repeated part '" + std::string(part) + "'");
    at = plus + 1;
  }
  return l;
}

const std::vector<LayoutSpec>& layout_values() {
  static const std::vector<LayoutSpec> v = {
      LayoutSpec{}, LayoutSpec{.strided = true}, LayoutSpec{.shared = true},
      LayoutSpec{.pool = PoolSize::k2G}, LayoutSpec{.pool = PoolSize::k4G}};
  return v;
}

std::string_view index_pattern_name(IndexPattern p) {
  switch (p) {
    case IndexPattern::kRandom: return "random";
    case IndexPattern::kDuplicates: return "dup";
    case IndexPattern::kInvalidRows: return "invalid_rows";
    case IndexPattern::kLengths: return "lens";
    case IndexPattern::kOutOfRange: return "oob";
    case IndexPattern::kLengthsGarbage: return "lens_garbage";
  }
  return "?";
}

const std::vector<IndexPattern>& index_patterns() {
  static const std::vector<IndexPattern> v = {IndexPattern::kRandom,     IndexPattern::kDuplicates,
                                              IndexPattern::kInvalidRows, IndexPattern::kLengths,
                                              IndexPattern::kOutOfRange, IndexPattern::kLengthsGarbage};
  return v;
}

IndexPattern parse_index_pattern(std::string_view s) {
  std::string names;
  for (IndexPattern p : index_patterns()) {
    if (s == index_pattern_name(p)) return p;
    names += (names.empty() ? "" : ", ") + std::string(index_pattern_name(p));
  }
  throw InputError("unknown index pattern '" + std::string(s) + "' (expected one of " + names + ")");
}

std::string_view lse_pattern_name(LsePattern p) {
  switch (p) {
    case LsePattern::kOrdinary: return "ordinary";
    case LsePattern::kPrefixEmpty: return "prefix_empty";
    case LsePattern::kSuffixEmpty: return "suffix_empty";
    case LsePattern::kPrefixPosInf: return "prefix_pinf";
    case LsePattern::kSuffixPosInf: return "suffix_pinf";
    case LsePattern::kBothEmpty: return "both_empty";
    case LsePattern::kBothPosInf: return "both_pinf";
    case LsePattern::kMixed: return "mixed";
  }
  return "?";
}

LsePattern parse_lse_pattern(std::string_view s) {
  for (LsePattern p : {LsePattern::kOrdinary, LsePattern::kPrefixEmpty, LsePattern::kSuffixEmpty, LsePattern::kPrefixPosInf,
                       LsePattern::kSuffixPosInf, LsePattern::kBothEmpty, LsePattern::kBothPosInf, LsePattern::kMixed})
    if (s == lse_pattern_name(p)) return p;
  throw InputError("unknown lse pattern '" + std::string(s) +
                   "' (expected ordinary, prefix_empty, suffix_empty, prefix_pinf, suffix_pinf, both_empty, both_pinf or mixed)");
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
  if (merge.active()) {
    // A merge case has two partial results and nothing else: no cache, no index sets.
    if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32)
      fail("a merge case's output dtype must be bf16, fp16 or fp32");
    if (merge.head_dim > 4096) fail("merge head_dim " + std::to_string(merge.head_dim) + " > 4096");
    if (!(merge.gap >= 0) || merge.gap > 1e4) fail("merge lse gap must be in [0, 1e4]");
    if (sparse.active()) fail("a merge case cannot be sparse too");
    if (kv_cache_dtype != KvCacheDtype::kAuto) fail("a merge case has no kv cache: kv_cache_dtype must be auto");
    if (total_t * num_heads() * merge.head_dim > kMaxElements) fail("case too large (more than 4e9 elements in one tensor)");
  } else {
    if (merge.head_dim < 0) fail("merge head_dim must be positive");
    if (merge.lse != LsePattern::kOrdinary || merge.gap != 0) fail("lse pattern and gap need a merge case (head_dim)");
    if (dtype != DType::kBF16 && dtype != DType::kF16) fail("model dtype must be bf16 or fp16");
  }
  if (block_size != 0 && (block_size < 1 || block_size > 1024 || (block_size & (block_size - 1)) != 0))
    fail("block size " + std::to_string(block_size) + " is not a power of two in [1, 1024]");
  if (!(q_magnitude > 0) || !std::isfinite(q_magnitude)) fail("q magnitude must be positive and finite");
  if (scale && (!(*scale > 0) || !std::isfinite(*scale))) fail("scale must be positive and finite");
  if (!(k_scale > 0) || !std::isfinite(k_scale)) fail("k_scale must be positive and finite");
  if (reference_k_scale_rounded && kv_cache_dtype != KvCacheDtype::kFp8 && kv_cache_dtype != KvCacheDtype::kFp8E4m3)
    fail("reference_k_scale model_dtype applies to fp8 and fp8_e4m3 caches (their per-tensor k_scale)");
  if (scale_rule != ScaleRule::kPow2 && kv_cache_dtype != KvCacheDtype::kFp8DsMla)
    fail("scale rule " + std::string(scale_rule_name(scale_rule)) + " applies to fp8_ds_mla caches only");
  if (kv_cache_dtype == KvCacheDtype::kFp8DsMla) {
    // The entry quantizes the latent in tiles of 128 and stores the RoPE part as bf16 verbatim.
    if (L % 128 != 0) fail("fp8_ds_mla needs kv_lora_rank a multiple of 128, got " + std::to_string(L));
    if (dtype != DType::kBF16) fail("fp8_ds_mla stores RoPE as bf16 verbatim: the model dtype must be bf16");
  }
  if (kv_cache_dtype == KvCacheDtype::kFp8V4) {
    if (L != 448 || R != 64) fail("fp8_v4 is DeepSeek V4's entry: dims v4 (kv_lora_rank 448, rope dim 64)");
    if (dtype != DType::kBF16) fail("fp8_v4 stores RoPE as bf16 verbatim: the model dtype must be bf16");
  }
  const SparseSpec& sp = sparse;
  if (sp.topk < 0 || sp.window < 0 || sp.compress < 0 || sp.extra_topk < 0) fail("sparse parameters must be >= 0");
  if (sp.topk > 65536 || sp.window > 1 << 20 || sp.extra_topk > 65536) fail("sparse index widths out of range");
  if (sp.topk > 0 && sp.window > 0) fail("topk (V3.2) and window (V4) exclude each other");
  if ((sp.compress > 0) != (sp.extra_topk > 0)) fail("compress and extra_topk go together (the V4 compressed cache)");
  if (sp.compress > 0 && sp.window == 0) fail("a compressed cache (compress) belongs to a V4 case: give window too");
  if (sp.compress == 1) fail("compress ratio 1 is no compression (use 4 or 128)");
  if (!sp.active() && (sp.sink || sp.pattern != IndexPattern::kRandom)) fail("sink and index pattern need topk or window");
  // Found by mlagate explore: a V4 case with oob was refused only when its inputs were made.
  if (sp.pattern == IndexPattern::kOutOfRange && sp.window > 0)
    fail("index pattern oob fills the unused slots of top-k rows; a V4 case (window) has none");
  if (!layout.contiguous()) {
    if (merge.active()) fail("a merge case has no paged cache or views: its layout must be contiguous");
    if (layout.shared) {
      int with_context = 0;
      for (std::size_t i = 0; i < batch.seq_lens.size(); ++i)
        if (batch.seq_lens[i] - batch.query_lens[i] > 0) ++with_context;
      if (with_context < 2) fail("layout shared needs at least two requests with cached context to share pages");
    }
  }
  const double n = num_heads();
  if (total_t * n * (P + R) > kMaxElements || total_s * (L + R) > kMaxElements || double(L) * n * (P + V) > kMaxElements)
    fail("case too large (more than 4e9 elements in one tensor)");
}

}  // namespace mlagate
