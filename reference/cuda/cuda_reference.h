// The fp64 reference on the GPU (--reference cuda): the same math as
// reference/fp64_reference.h's reference_absorbed and reference_mqa, for big suites on a
// GPU machine. Free of CUDA headers. Throws DeviceUnavailableError without a GPU.
//
// Agreement with the Eigen reference (tests/device): relative 1e-10 with a floor
// of 1e-3 of the reference RMS on every smoke and edges case; both are fp64 and
// differ only in summation order and the exp/log of the two math libraries.
//
// Also the layer glue's up-projection of latent keys to K and V on the GPU
// (cuda_project_rows): with --reference cuda it replaces the CPU's row-wise
// GEMM (reference/glue.h, set_row_projector) and writes the same bits.
#pragma once

#include <span>
#include <vector>

#include "cases/case.h"
#include "cases/tensor.h"
#include "reference/fp64_reference.h"
#include "reference/device_staging.h"
#include "reference/glue.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {

// The key splits of the MQA core on the GPU. One thread block walks a group of
// up to 16 query rows over its keys in order; a case of few rows and many
// keys (one head, one request of 270,000 keys: a single block) left the GPU
// idle for seconds. So when the row groups number fewer than
// kReferenceTargetBlocks, each request's keys are cut into up to
// ceil(max_keys / kReferenceSplitKeys) ranges (no more than the blocks need),
// each range's normalized rows and LSE kept in fp64 and merged through their
// LSEs in double. The count depends on the case's shape alone, never on the
// device, so a case gives the same bits on every GPU; the partials take at
// most kReferenceTargetBlocks x 16 rows of fp64 values.
inline constexpr int kReferenceSplitKeys = 1024;
inline constexpr long long kReferenceTargetBlocks = 2048;
int reference_mqa_splits(long long row_groups, int max_keys);

// As reference_absorbed: out [T, N*V], lse [T, N], o_lat [T, N, L].
ReferenceOutputs cuda_reference_absorbed(const Case& c);

// As reference_mqa: the attention core on given latent queries q_lat [T, N, L]
// (any 16-bit model dtype or f64) with q_pe from c.q.
void cuda_reference_mqa(const Case& c, const TensorView& q_lat, std::vector<double>& o_lat, std::vector<double>& lse);

// A RowProjector (reference/glue.h): the runs of latent rows up-projected on
// the GPU, bit for bit what the CPU's row-wise GEMM writes (every non-NaN
// element; a NaN is NaN on both, its payload not promised). Every element is
// one thread's __fmaf_rn chain over the latent dimension in increasing order
// from +0 (row_projection.cu: 128 x 128 block tiles, depth steps of 8, 8 x 8
// outputs a thread, no split of the depth, no tensor cores), then rounded by
// cases/encoding.h's own integer code compiled for the device. Rows go in
// chunks of at most 64 MiB of K and V (pinned on the host twice, on the device
// once); the weights of the last case stay on the device (kept only while its
// bytes are the same). Thread-safe (one call at a time). Throws
// DeviceUnavailableError without a GPU.
void cuda_project_rows(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::span<const RowRun> runs);

// Every row of kv_c [s, L] / k_pe [s, R] up-projected into device memory:
// K [s, N, P+R] at k and V [s, N, V] at v (device pointers of that many
// model-dtype elements), with cuda_project_rows's kernels and so its bits;
// nothing comes back to the host. The rows go up in chunks of 8192 latent
// rows through pinned memory. Finished when it returns.
void cuda_project_rows_on_device(const Case& c, const TensorView& kv_c, const TensorView& k_pe, void* k, void* v);

// Frees what cuda_project_rows keeps between calls (stream, weights, chunk
// buffers); the next call makes them again.
void cuda_release_row_projector();

// An AttentionEmulator (reference/sdpa_emulation.h): the baseline emulation's
// attention core on the GPU, byte for byte what emulate_attention_fixed_order
// writes (every non-NaN element; a NaN's payload is not promised). The
// prefill form's K and V are projected on the device where their latent rows
// are named. A stream of its own, one synchronization a call; serialized by
// a lock. Its device buffers stay between calls (grown to the largest) until
// cuda_release_attention_emulator().
void cuda_emulate_attention(std::span<const EmulatedAttention> calls);
void cuda_release_attention_emulator();

// The GPU's DeviceStaging (reference/device_staging.h): host bytes go up
// through two pinned buffers in turn, device copies stay on the device, two
// scratch slots are kept between calls. Its functions throw
// DeviceUnavailableError without a GPU.
const DeviceStaging* cuda_device_staging();

}  // namespace mlagate
