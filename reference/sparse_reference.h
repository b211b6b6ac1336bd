// References of the sparse ops (DeepSeek V3.2 top-k and V4 window + compressed
// attention; semantics in cases/sparse.h and backends/backend.h): the fp64
// golden over the dequantized caches, and the plain model-dtype implementation
// whose error against it is the baseline policy's err_baseline.
#pragma once

#include <vector>

#include "cases/case.h"
#include "cases/tensor.h"

namespace mlagate {

struct SparseReference {
  std::vector<double> o;    // [T, N, Dv]
  std::vector<double> lse;  // [T, N] natural log, the sink left out; -inf for rows with no key
};

// The query every sparse op gets: [T, N, L+R] model dtype, q_lat (absorbed
// through W_UK, model dtype) then q_pe from c.q.
Tensor sparse_query(const Case& c, const TensorView& q_lat);

// fp64 from the rounded inputs: keys are what a correct reader of the cache
// sees (c.kv_c_cache for fp8 caches), read at the positions of
// main_positions / extra_positions; q: sparse_query's tensor.
SparseReference sparse_golden(const Case& c, const TensorView& q);

// The same math as a plain GPU kernel in the model dtype: keys rounded to the
// model dtype, fp32 logits and softmax with the row max subtracted, the
// unnormalized probabilities rounded to the model dtype before P@V, fp32
// accumulation, the sink added to the fp32 denominator, the output rounded.
SparseReference sparse_emulation(const Case& c, const TensorView& q);

}  // namespace mlagate
