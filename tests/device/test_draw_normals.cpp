// cuda_draw_normals (reference/cuda/draw_normals.cu): the case inputs drawn
// on the GPU are the CPU generator's bits, tensor for tensor (both model
// dtypes, several factors, one tensor larger than a device chunk). Skipped
// without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cases/case.h"
#include "reference/cuda/cuda_reference.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

struct DrawnTensor {
  DType dtype;
  Shape shape;
  std::uint64_t seed;
  const char* name;
  double factor;
};

TEST(CudaDrawNormals, EveryTensorIsTheCpuGeneratorsBits) {
  MLAGATE_REQUIRE_GPU();
  ASSERT_TRUE(cuda_normal_drawer_agrees());
  const std::vector<DrawnTensor> tensors = {
      {DType::kBF16, {4099, 576}, 0, "kv_c", 1.0},
      {DType::kF16, {512, 16, 128}, 7, "w_uk", 0.044194173824159216},
      {DType::kBF16, {37, 128, 192}, 2082650989, "q", 8.0},
      {DType::kF16, {300, 1000}, 11, "q", 0.25},
      // More than one device chunk (2^24 elements): the second starts at its offset.
      {DType::kBF16, {(std::int64_t{1} << 24) / 512 + 3, 512}, 41, "kv_c", 1.0},
  };
  for (const DrawnTensor& d : tensors) {
    Tensor cpu(d.dtype, d.shape), gpu(d.dtype, d.shape);
    ASSERT_GE(cpu.numel(), kDrawOnDeviceElements) << "too small to go to the drawer";
    fill_normal_on_cpu(cpu, d.seed, d.name, d.factor);
    std::memset(gpu.bytes(), 0xFF, gpu.nbytes());
    {
      const NormalDrawerScope scope(cuda_draw_normals);
      fill_normal(gpu, d.seed, d.name, d.factor);
    }
    std::size_t first_diff = gpu.nbytes();
    for (std::size_t i = 0; i < gpu.nbytes(); ++i)
      if (cpu.bytes()[i] != gpu.bytes()[i]) {
        first_diff = i;
        break;
      }
    EXPECT_EQ(first_diff, gpu.nbytes()) << d.name << " seed " << d.seed << ": first differing byte";
  }
  cuda_release_normal_drawer();
}

}  // namespace
}  // namespace mlagate
