// libtorch CUDA backends, one per kernel of torch's scaled_dot_product_attention:
// torch.sdpa.flash, torch.sdpa.efficient, torch.sdpa.cudnn, torch.sdpa.math.
// Each forces its kernel (the others disabled, as torch.nn.attention.sdpa_kernel
// does) and calls it directly for the output and its log-sum-exp:
// - decode: the paged cache goes to the GPU and is gathered through the block
//   table there (fp8 entries dequantized on the GPU), then MQA over
//   [kv_c | k_pe] with v = kv_c, heads as query rows (head dims L+R and L,
//   576 and 512 for DeepSeek) - NOT_SUPPORTED with the kernel's own reason
//   where it refuses them;
// - prefill: per request over the up-projected keys the harness gives (the
//   layer's gather and up-projection are the harness's, as for every backend).
// No mask is passed: queries that see all keys run together, a causal call
// with as many queries as keys uses is_causal, and otherwise (a query sees a
// prefix of the keys: spec decode, the kernel-level prefill op) each query
// token is its own call over its visible keys.
// Built with libtorch >= 2 only (MLAGATE_HAS_TORCH_SDPA: libtorch 1.x cannot
// force a kernel); without a GPU every op is SKIPPED. This header is free of
// torch headers.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace mlagate {

enum class TorchSdpaKernel { kFlash, kEfficient, kCudnn, kMath };

std::unique_ptr<Backend> make_torch_sdpa(TorchSdpaKernel kernel);
inline std::unique_ptr<Backend> make_torch_sdpa_flash() { return make_torch_sdpa(TorchSdpaKernel::kFlash); }
inline std::unique_ptr<Backend> make_torch_sdpa_efficient() { return make_torch_sdpa(TorchSdpaKernel::kEfficient); }
inline std::unique_ptr<Backend> make_torch_sdpa_cudnn() { return make_torch_sdpa(TorchSdpaKernel::kCudnn); }
inline std::unique_ptr<Backend> make_torch_sdpa_math() { return make_torch_sdpa(TorchSdpaKernel::kMath); }

// Gives the device blocks libtorch's caching allocator keeps (what the
// backends took) back to the driver; a no-op without a GPU. For measuring
// device memory (tests/device/test_device_memory.cpp).
void torch_sdpa_release_cached_memory();

}  // namespace mlagate
