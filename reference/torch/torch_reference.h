// The seed test's SDPA reference computed with libtorch (vLLM's
// test_mla_backends.py): per request, torch's scaled_dot_product_attention in
// the model dtype with the boolean mask (context visible, causal on the query
// part), in both forms of SPEC: The two paths. A plain C++ API: libtorch stays
// inside reference/torch/, in a module loaded at the first call (torch_module.h);
// without libtorch this compiles to a stub that says so.
#pragma once

#include <span>
#include <string>

#include "cases/case.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {

struct TorchReferenceOptions {
  bool cuda = false;  // on the GPU (libtorch with CUDA), else on the CPU
  bool fp64 = false;  // every tensor in fp64 instead of the model dtype (the cross-check with the reference)
  // The decode form in the seed's literal layout, the latent key expanded to
  // N heads with stride 0 (see torch_sdpa_layer); default: heads folded into rows.
  bool seed_layout = false;
};

// Whether this build has libtorch and its module loads; a line naming it
// ("libtorch 1.13.1, CPU"), or saying why not.
bool torch_reference_available();
std::string torch_reference_info();
bool torch_cuda_available();  // libtorch with CUDA and a GPU

// The layer reference of the given requests through one form, as the seed
// test computes it. out [T, N*V] (rows of other requests NaN); lse stays empty:
// SDPA returns none. Differences from the seed's literal code, none of which
// changes a row's arithmetic: the decode form attends all heads as rows of one
// head against the shared latent key (the seed expands the key to N heads
// with stride 0: libtorch's CPU matmul materializes that copy, and PyTorch
// 2.11's efficient CUDA kernel returns a wrong answer for it on a 33-token
// request without context, reference/POLICIES.md "Torch reference"; options.seed_layout
// keeps the literal layout); the prefill form runs heads in groups to bound
// memory; a seq_len-0 padding request gets 0 (SDPA over no key gives NaN);
// fp8 caches read the dequantized cache.
// Throws NotSupportedError (cases/errors.h) for what libtorch cannot compute
// here: CUDA asked without a GPU, fp16 on the CPU with libtorch 1.x (no fp16
// matmul there); std::runtime_error without libtorch and for other errors.
SdpaResult torch_sdpa_layer(const Case& c, SdpaForm form, std::span<const int> requests,
                            const TorchReferenceOptions& o);

// The SDPA kernel torch's dispatcher picks for the form's call (in the layout
// the options select) on the case's first request with keys ("math", "flash",
// "efficient", "cudnn"), for the record; libtorch 1.x has no dispatcher query
// and answers "math".
std::string torch_sdpa_kernel(const Case& c, SdpaForm form, const TorchReferenceOptions& o);

}  // namespace mlagate
