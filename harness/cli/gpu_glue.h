// What `run --reference cuda` moves to the GPU for the run's length, in the
// parent and in each worker (they plan the same flags): the layer glue's
// up-projection of latent keys to K and V (reference/glue.h; its bits are the
// CPU's, cuda_project_rows, so no record changes, only the time); the prefill
// path's K and V lent in device memory to backends that read them there
// (reference/device_staging.h: made there from the latent rows, never in host
// memory); and the baseline emulation's attention cores (the fixed
// order of reference/sdpa_emulation.h: the CPU's bits, on any GPU). Built
// only with CUDA.
#pragma once

#include <cstdlib>
#include <string_view>

#include "reference/cuda/cuda_reference.h"
#include "reference/device_staging.h"
#include "reference/glue.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {

class GpuGlue {
 public:
  GpuGlue(bool on, bool emulate)
      : release_{on, on && emulate}, scope_(on ? cuda_project_rows : row_projector()),
        staging_(on ? staging_for_run() : device_staging()),
        emulator_(on && emulate ? cuda_emulate_attention : attention_emulator()) {}

  // For a run whose reference is `reference`. MLAGATE_GLUE_DEVICE=cpu keeps
  // all of it on the CPU, and MLAGATE_EMULATION_DEVICE=cpu the baseline
  // emulation alone (the same bits either way): for measuring what the GPU
  // saves (PERFORMANCE.md).
  static bool on_cpu(const char* var) {
    const char* v = std::getenv(var);
    return v && std::string_view(v) == "cpu";
  }
  // The GPU's staging; MLAGATE_KV_DEVICE=upload takes its projector away,
  // so that the prefill path's K and V are projected into host memory and
  // uploaded, as before it had one: for measuring what it saves.
  static const DeviceStaging* staging_for_run() {
    const char* v = std::getenv("MLAGATE_KV_DEVICE");
    if (!v || std::string_view(v) != "upload") return cuda_device_staging();
    static const DeviceStaging upload_only = [] {
      DeviceStaging s = *cuda_device_staging();
      s.project = nullptr;
      return s;
    }();
    return &upload_only;
  }
  explicit GpuGlue(std::string_view reference)
      : GpuGlue(reference == "cuda" && !on_cpu("MLAGATE_GLUE_DEVICE"), !on_cpu("MLAGATE_EMULATION_DEVICE")) {}

 private:
  struct Release {
    bool projector, emulator;
    ~Release() {
      // After the scopes have put the previous ones back.
      if (projector) cuda_release_row_projector();
      if (emulator) cuda_release_attention_emulator();
    }
  } release_;
  RowProjectorScope scope_;
  DeviceStagingScope staging_;
  AttentionEmulatorScope emulator_;
};

}  // namespace mlagate
