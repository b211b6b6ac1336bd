// A libtorch reference module of "another build" for TorchModule.OtherBuild:
// the right entry point with a key no build of this tree gives. The loader
// must refuse it before calling anything in it (its calls are null).
#include "reference/torch/torch_module.h"

extern "C" __attribute__((visibility("default"))) const mlagate::torch_module::Api* mlagate_torch_reference_module() {
  static const mlagate::torch_module::Api api{.key = "0.0.0+another-build/1/2/3/4"};
  return &api;
}
