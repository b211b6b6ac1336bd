// Test-only CUDA plugins for graph mode (`--cuda-graph`) through the C ABI
// (plugin.h 1.1: graph_ops, prepare), around the example plugin's decode kernel
// (examples/plugin_cuda), on the GPU machine:
//   rel.cuda_graph_decode          the example's run() with a prepare() that
//                                  copies the call's seq_lens into a workspace
//                                  allocated once and refreshed in place; run()
//                                  reads them from there: right eagerly and
//                                  under graph replay
//   rel.cuda_graph_stale_metadata  vLLM #35175's class: the same, but prepare()
//                                  allocates a fresh workspace for every call;
//                                  eager calls are right, a replayed graph keeps
//                                  reading the workspace of its capture
#define MLA_DECODE_CUDA_EXAMPLE_NO_ENTRY
#include "examples/plugin_cuda/mla_decode_cuda.cu"

#include <cstring>
#include <vector>

namespace {

constexpr int kMaxRequests = 4096;  // the in-place workspace's capacity

struct Meta {
  bool fresh_each_call;         // the planted bug
  int* current = nullptr;       // what run() reads
  std::vector<int*> allocated;  // never freed while the library lives: a stale graph reads old, valid memory
};
Meta g_meta[2] = {{false}, {true}};

int32_t graph_prepare(void* self, const mlagate_problem* p, const mlagate_args* args, char* msg, size_t size) {
  Meta& m = *static_cast<Meta*>(self);
  if (p->num_requests > kMaxRequests) return say(msg, size, "more requests than the workspace holds", MLAGATE_STATUS_NOT_SUPPORTED);
  if (m.fresh_each_call || m.current == nullptr) {
    int* w = nullptr;
    if (cudaMalloc(&w, sizeof(int) * kMaxRequests) != cudaSuccess) return say(msg, size, "cudaMalloc failed", MLAGATE_STATUS_ERROR);
    m.allocated.push_back(w);
    m.current = w;
  }
  const cudaError_t e = cudaMemcpyAsync(m.current, p->seq_lens, sizeof(int) * p->num_requests, cudaMemcpyHostToDevice,
                                        static_cast<cudaStream_t>(args->stream));
  if (e != cudaSuccess) return say(msg, size, cudaGetErrorString(e), MLAGATE_STATUS_ERROR);
  return MLAGATE_STATUS_OK;
}

int32_t graph_run(void* self, const mlagate_problem* p, const mlagate_args* args, char* msg, size_t size) {
  const Meta& m = *static_cast<const Meta*>(self);
  if (m.current == nullptr) return say(msg, size, "run() before prepare()", MLAGATE_STATUS_ERROR);
  mlagate_args a = *args;
  a.decode.seq_lens.data = m.current;  // the schedule prepare() made
  return run(nullptr, p, &a, msg, size);
}

mlagate_backend g_tables[2];
mlagate_plugin g_plugin;

}  // namespace

extern "C" MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void) {
  const char* names[2] = {"rel.cuda_graph_decode", "rel.cuda_graph_stale_metadata"};
  const char* what[2] = {"the example decode; prepare() refreshes a persistent workspace in place",
                         "the example decode; prepare() allocates a fresh workspace per call (vLLM #35175)"};
  for (int i = 0; i < 2; ++i) {
    g_tables[i] = make_backend();
    g_tables[i].name = names[i];
    g_tables[i].description = what[i];
    g_tables[i].self = &g_meta[i];
    g_tables[i].prepare = graph_prepare;
    g_tables[i].run = graph_run;
  }
  std::memset(&g_plugin, 0, sizeof g_plugin);
  g_plugin.abi_version = MLAGATE_PLUGIN_ABI_VERSION;
  g_plugin.struct_size = sizeof(mlagate_plugin);
  g_plugin.library = "mlagate_cuda_graph_plugin";
  g_plugin.num_backends = 2;
  g_plugin.backends = g_tables;
  g_plugin.abi_minor = MLAGATE_PLUGIN_ABI_MINOR;
  g_plugin.backend_struct_size = sizeof(mlagate_backend);
  return &g_plugin;
}
