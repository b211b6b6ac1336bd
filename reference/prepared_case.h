// A case with its references, made once and shared by every backend: the
// generated inputs, the fp64 references of each op and the paged cache of each
// block size. The runner makes one from a generated case; golden files store
// and load one (golden/), so that `run --golden` and `replay` judge backends
// against exactly the stored values.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <vector>

#include "cases/case.h"
#include "cases/paged_cache.h"
#include "cases/tensor.h"
#include "reference/fp64_reference.h"
#include "reference/merge_reference.h"

namespace mlagate {

// err_baseline's parts as the emulation (reference/sdpa_emulation.h) gives
// them against the case's references, stored by export: the layer op per form
// (0 decode, 1 prefill) and request [B] (NaN: not stored), and each
// kernel-level op's (out, lse).
struct StoredBaselines {
  std::array<std::vector<double>, 2> layer_out, layer_lse;
  std::optional<std::array<double, 2>> decode_op, prefill_op, sparse;
};

// What is left empty is computed as in a plain run (the runner fills it).
struct PreparedCase {
  Case c;
  std::optional<ReferenceOutputs> reference;  // absorbed path: out [T, N*V], lse [T, N] (o_lat may be empty)
  // Kernel-level decode: the absorbed queries and the fp64 reference on exactly them.
  struct DecodeReference {
    Tensor q_lat, q_pe;               // [T, N, L], [T, N, R] model dtype
    std::vector<double> o_lat, lse;   // [T, N, L], [T, N]
  };
  std::optional<DecodeReference> decode;
  // Sparse ops: the kernels' query [T, N, L+R] and the fp64 reference on it
  // (the case's sparse inputs are in c.sparse).
  struct SparseReference {
    Tensor q;
    std::vector<double> o, lse;  // [T, N, Dv], [T, N]
  };
  std::optional<SparseReference> sparse;
  // merge_states: the fp64 merge (the case's two partial results are in c.merge).
  std::optional<MergeReference> merge;
  std::optional<StoredBaselines> baselines;
  // fp8 caches: the references over the unquantized inputs (an auto case's
  // out, and its decode op's o_lat), for the quantization error records report.
  std::optional<std::vector<double>> unquantized, unquantized_mqa;
  std::map<int, PagedCache> caches;  // block size -> cache without the new tokens (write_new_tokens = false)
  // false: a backend whose block size has no cache here is SKIPPED (replay runs stored caches only).
  bool build_missing_caches = true;
};

}  // namespace mlagate
