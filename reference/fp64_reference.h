// The fp64 reference reference (Eigen): both paths of SPEC: The two paths from the
// rounded inputs, and the attention core on given latent queries for the
// kernel-level decode op. Visibility: query u of request i (position c_i + u)
// sees keys 0 .. c_i + u of that request; a request with no visible key gives
// output 0 and lse -inf. Keys are read from c.kv_c_cache / c.k_pe_cache when
// the case has them (fp8 caches: the dequantized cache), else c.kv_c / c.k_pe.
#pragma once

#include <vector>

#include "cases/case.h"
#include "cases/tensor.h"

namespace mlagate {

struct ReferenceOutputs {
  std::vector<double> out;    // [T, N*V] layer output (= prefill op's o [T, N, V])
  std::vector<double> lse;    // [T, N] natural log; -inf for rows with no key
  std::vector<double> o_lat;  // [T, N, L] decode path only (empty for the MHA path)
};

// Decode / absorbed path: ql = q_nope W_UK^T, MQA over [kv_c, k_pe], then W_UV.
ReferenceOutputs reference_absorbed(const Case& c);
// Prefill / MHA path: k_nope = kv_c W_UK, v = kv_c W_UV per head, ordinary attention.
ReferenceOutputs reference_mha(const Case& c);

// Attention core for the kernel-level decode op on the given latent queries.
// q_lat: [T, N, L] any dtype; q_pe comes from c.q. Fills o_lat [T,N,L] and lse [T,N].
void reference_mqa(const Case& c, const TensorView& q_lat, std::vector<double>& o_lat,
                   std::vector<double>& lse);

// Largest |a-b| / max(|b|, floor) over finite pairs; infinities must match.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b, double floor);

}  // namespace mlagate
