// The kernels of the GPU up-projection (row_projection.cu), launched by its
// host side (row_projection.cpp). Internal to reference/cuda: includes the
// CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mlagate::gpu {

// Tile of the projection GEMM: a block of kProjRows rows x kProjCols columns,
// the depth in steps of kProjDepth; 256 threads, 8 x 8 outputs each.
inline constexpr int kProjRows = 128, kProjCols = 128, kProjDepth = 8, kProjThreads = 256;

// out(j, col) = the fma chain over l = 0..depth-1 of a[j * depth + l] *
// b[l * cols + col], from +0, in increasing l (one chain per element: no
// split of the depth), rounded to bf16 (else fp16) by cases/encoding.h's
// f32_bits_to_bf16 / f32_bits_to_f16 and stored at dst[j * row_stride +
// (col / head_width) * head_stride + col % head_width]. a: [rows, depth]
// floats, b: [depth, cols] floats, device memory.
void launch_projection_gemm(const float* a, int rows, int depth, const float* b, int cols, int head_width,
                            int head_stride, long long row_stride, bool bf16, std::uint16_t* dst, cudaStream_t s);

// dst[j * heads * head_stride + h * head_stride + offset + r] = pe[j * R + r]
// for every head h: the rope part of K, the same bits in every head.
void launch_pe_broadcast(const std::uint16_t* pe, int rows, int heads, int R, int head_stride, int offset,
                         std::uint16_t* dst, cudaStream_t s);

}  // namespace mlagate::gpu
