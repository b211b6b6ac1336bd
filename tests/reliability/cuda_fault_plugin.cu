// Test-only CUDA backends with planted device faults, as a plugin (kDLCUDA:
// mlagate hands it device pointers), for isolation and --sanitize on the GPU
// machine. Neither computes attention: their outputs are zeros, and the point
// is the fault.
//   rel.cuda_illegal_address  one thread writes 2^34 elements past o_lat: the
//                             launch fails with an illegal address; the CUDA
//                             context is unusable afterwards (sticky error)
//   rel.cuda_oob_write        the last thread writes one element past o_lat:
//                             lands in mlagate's device guard band (INCORRECT),
//                             and compute-sanitizer memcheck names the kernel
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "mlagate/plugin.h"

namespace {

__global__ void zero_outputs(unsigned short* o_lat, long long o_numel, float* lse, long long lse_numel, long long poke) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i < o_numel) o_lat[i] = 0;
  if (i < lse_numel) lse[i] = 0.f;
  if (i == o_numel - 1 && poke != 0) o_lat[o_numel - 1 + poke] = 0x7FC0;  // the planted fault
}

struct Fault {
  const char* name;
  const char* description;
  long long poke;  // elements past the last one
};
const Fault kFaults[] = {
    {"rel.cuda_illegal_address", "writes far past its output: illegal memory access", 1ll << 34},
    {"rel.cuda_oob_write", "writes one element past its output (guard band, memcheck)", 1},
};
constexpr int kCount = 2;

const int32_t kBlockSizes[] = {64, 16};

long long numel(const DLTensor& t) {
  long long n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

int32_t run(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, size_t msg_size) {
  const Fault& f = *static_cast<const Fault*>(self);
  if (p->op != MLAGATE_OP_DECODE) {
    std::snprintf(msg, msg_size, "decode only");
    return MLAGATE_STATUS_NOT_SUPPORTED;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::snprintf(msg, msg_size, "no CUDA device");
    return MLAGATE_STATUS_UNAVAILABLE;
  }
  const long long on = numel(a->decode.o_lat), ln = numel(a->decode.lse);
  const long long n = on > ln ? on : ln;
  auto stream = static_cast<cudaStream_t>(a->stream);
  zero_outputs<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<unsigned short*>(a->decode.o_lat.data), on, static_cast<float*>(a->decode.lse.data), ln, f.poke);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    std::snprintf(msg, msg_size, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    return MLAGATE_STATUS_ERROR;
  }
  return MLAGATE_STATUS_OK;
}

mlagate_backend g_tables[kCount];
mlagate_plugin g_plugin;

}  // namespace

extern "C" MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void) {
  for (int i = 0; i < kCount; ++i) {
    mlagate_backend& t = g_tables[i];
    std::memset(&t, 0, sizeof t);
    t.name = kFaults[i].name;
    t.description = kFaults[i].description;
    t.ops = MLAGATE_OP_DECODE;
    t.block_sizes = kBlockSizes;
    t.num_block_sizes = 2;
    t.query_len_support = MLAGATE_QUERY_LEN_VARLEN;
    t.reorder_threshold = 1 << 20;  // every request is a decode: the layer op needs no prefill
    t.dtypes = MLAGATE_DTYPE_BF16 | MLAGATE_DTYPE_F16;
    t.kv_cache_dtypes = MLAGATE_KV_AUTO;
    t.device = {kDLCUDA, 0};
    t.self = const_cast<Fault*>(&kFaults[i]);
    t.run = run;
  }
  g_plugin.abi_version = MLAGATE_PLUGIN_ABI_VERSION;
  g_plugin.struct_size = sizeof(mlagate_plugin);
  g_plugin.library = "mlagate_cuda_fault_plugin";
  g_plugin.num_backends = kCount;
  g_plugin.backends = g_tables;
  return &g_plugin;
}
