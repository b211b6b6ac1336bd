// MLAGATE_REQUIRE_GPU(): the first line of a test that needs a CUDA device.
// Without one the test is SKIPPED with the reason (never passed), so CI's
// GPU-less machine shows what it did not run. Tests that use it link the CUDA
// backends (backends/cuda/cuda_backends.h).
#pragma once

#include <gtest/gtest.h>

#include "backends/cuda/cuda_backends.h"

#define MLAGATE_REQUIRE_GPU()                                                    \
  do {                                                                           \
    if (!mlagate::cuda_device_info().available)                                  \
      GTEST_SKIP() << mlagate::cuda_device_info().error;                         \
  } while (0)
