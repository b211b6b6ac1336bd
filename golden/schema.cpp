// Schema v1 pieces shared by the writer and the reader: id paths, the case
// shell derived from a spec, input and output shapes, and the cache template.
#include "golden/detail/schema.h"

#include <cstdio>

namespace mlagate::golden::schema {

std::string file_kind_name(FileKind k) { return k == FileKind::kGolden ? "golden" : "results"; }

std::vector<std::string> id_path(const std::string& id) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = id.find('/', start);
    parts.push_back(id.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  for (const auto& p : parts) {
    if (p.empty() || p == ".") throw GoldenFileError("case id '" + id + "' cannot name an HDF5 group (empty or '.' component)");
    for (unsigned char ch : p)
      if (ch < 0x20 || ch == 0x7f) throw GoldenFileError("case id '" + id + "' holds a control character");
  }
  if (id.size() > kMaxIdBytes) throw GoldenFileError("case id longer than " + std::to_string(kMaxIdBytes) + " bytes");
  return parts;
}

std::string cache_group_name(int block_size) { return "bs" + std::to_string(block_size); }

std::array<const Tensor*, 5> input_tensors(const Case& c) { return {&c.q, &c.kv_c, &c.k_pe, &c.w_uk, &c.w_uv}; }
std::array<Tensor*, 5> input_tensors(Case& c) { return {&c.q, &c.kv_c, &c.k_pe, &c.w_uk, &c.w_uv}; }

std::array<Shape, 5> input_shapes(const CaseSpec& spec) {
  const Dims& d = spec.dims;
  const std::int64_t T = spec.num_tokens(), S = spec.num_kv_tokens(), N = spec.num_heads();
  return {Shape{T, N, d.nope_dim + d.rope_dim}, Shape{S, d.kv_lora_rank}, Shape{S, d.rope_dim},
          Shape{d.kv_lora_rank, N, d.nope_dim}, Shape{d.kv_lora_rank, N, d.v_head_dim}};
}

PagedCache cache_template(const CaseSpec& spec, int block_size) {
  CaseSpec one = spec;
  one.batch.seq_lens = {1};
  one.batch.query_lens = {1};
  one.batch.spec_decode = false;
  Case c = case_layout(one);
  c.kv_c = Tensor(spec.dtype, {1, spec.dims.kv_lora_rank});
  c.k_pe = Tensor(spec.dtype, {1, spec.dims.rope_dim});
  CacheOptions opt;
  opt.poison = Poison::kNone;
  opt.spare_blocks = 0;
  return build_paged_cache(c, block_size, opt);
}

bool output_shape(const CaseSpec& spec, const std::string& op, const std::string& output, OutputShape& out) {
  const std::int64_t T = spec.num_tokens(), N = spec.num_heads();
  const Dims& d = spec.dims;
  if (output == "lse") {
    out = {{T, N}, DType::kF32, N, 1};
    return op == "layer" || op == "decode" || op == "prefill" || op == "sparse_decode" || op == "sparse_prefill" ||
           op == "merge_states";
  }
  if (op == "merge_states" && output == "out") {
    const std::int64_t D = spec.merge.head_dim;
    out = {{T, N, D}, spec.dtype, N, D};
    return spec.merge.active();
  }
  if ((op == "sparse_decode" || op == "sparse_prefill") && output == "o") {
    const std::int64_t dv = spec.sparse_dv();
    out = {{T, N, dv}, spec.dtype, N, dv};
    return true;
  }
  if (op == "layer" && output == "out") {
    out = {{T, N * d.v_head_dim}, spec.dtype, N, d.v_head_dim};
    return true;
  }
  if (op == "decode" && output == "o_lat") {
    out = {{T, N, d.kv_lora_rank}, spec.dtype, N, d.kv_lora_rank};
    return true;
  }
  if (op == "prefill" && output == "o") {
    out = {{T, N, d.v_head_dim}, spec.dtype, N, d.v_head_dim};
    return true;
  }
  return false;
}

}  // namespace mlagate::golden::schema
