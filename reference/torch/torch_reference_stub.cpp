// Built instead of torch_reference.cpp when libtorch is not found: the API
// links everywhere and says there is no libtorch.
#include <stdexcept>

#include "reference/torch/torch_reference.h"

namespace mlagate {

bool torch_reference_available() { return false; }
std::string torch_reference_info() { return "built without libtorch"; }
bool torch_cuda_available() { return false; }

SdpaResult torch_sdpa_layer(const Case&, SdpaForm, std::span<const int>, const TorchReferenceOptions&) {
  throw std::runtime_error("torch reference: this build has no libtorch");
}

std::string torch_sdpa_kernel(const Case&, SdpaForm, const TorchReferenceOptions&) {
  throw std::runtime_error("torch reference: this build has no libtorch");
}

}  // namespace mlagate
