// The per-case memory estimate (memory_estimate.h), term by term as the
// runner allocates.
#include "harness/reliability/memory_estimate.h"

#include <fstream>
#include <sstream>
#include <string>

namespace mlagate {

std::uint64_t estimate_case_bytes(const CaseSpec& spec, bool prefill_op) {
  const double L = spec.dims.kv_lora_rank, R = spec.dims.rope_dim, P = spec.dims.nope_dim, V = spec.dims.v_head_dim;
  const double N = spec.num_heads();
  double T = 0, S = 0, B = static_cast<double>(spec.batch.seq_lens.size());
  for (int q : spec.batch.query_lens) T += q;
  double S_up = 0;  // tokens whose keys and values are up-projected
  for (std::size_t i = 0; i < spec.batch.seq_lens.size(); ++i) {
    S += spec.batch.seq_lens[i];
    if (prefill_op || spec.batch.query_lens[i] > 1) S_up += spec.batch.seq_lens[i];
  }
  const double half = 2, f32 = 4, f64 = 8;
  double bytes = 0;
  bytes += T * N * (P + R) * half;                  // q
  bytes += S * (L + R) * half;                      // kv_c, k_pe
  bytes += L * N * (P + V) * half;                  // W_UK, W_UV
  bytes += T * N * (V + 1 + L + R) * f64 * 3;       // golden, baseline, unquantized references (out, lse, o_lat)
  bytes += (S + B * 1024) * (L + R) * half * 3;     // paged caches (two block sizes, padding blocks) and a copy
  bytes += S_up * N * (P + R + V) * half;           // up-projected k, v (prefill)
  bytes += T * N * (L + R) * (half * 2 + f32);      // absorbed queries, latent outputs, fp32 accumulators
  bytes += T * N * V * (half + f32) * 2;            // outputs with guard bands, merge buffers
  return static_cast<std::uint64_t>(bytes * 1.5);
}

std::uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream s(line.substr(13));
      std::uint64_t kib = 0;
      s >> kib;
      return kib * 1024;
    }
  return 0;
}

}  // namespace mlagate
