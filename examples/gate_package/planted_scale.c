/* A planted bug for the gate to catch (tests/plugin/package_gate.sh): the
 * example plugin, included whole, with every decode output scaled by
 * MLAGATE_EXAMPLE_BUG_SCALE (default 1.01, a 1% error). Built instead of the
 * correct plugin with -DMLAGATE_EXAMPLE_PLANT_BUG=ON. */
#include "mlagate/plugin.h"

#define mlagate_plugin_entry example_plugin_entry /* the example's entry, wrapped below */
#include MLAGATE_EXAMPLE_PLUGIN_SOURCE
#undef mlagate_plugin_entry

#ifndef MLAGATE_EXAMPLE_BUG_SCALE
#define MLAGATE_EXAMPLE_BUG_SCALE 1.01f
#endif

static int32_t run_scaled(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, size_t msg_size) {
  const int32_t status = run(self, p, a, msg, msg_size);
  if (status == MLAGATE_STATUS_OK && p->op == MLAGATE_OP_DECODE) {
    const DLTensor* o = &a->decode.o_lat;
    uint16_t* x = o->data;
    const int bf16 = p->dtype == MLAGATE_DTYPE_BF16;
    int64_t count = 1, i;
    int k;
    for (k = 0; k < o->ndim; ++k) count *= o->shape[k];
    for (i = 0; i < count; ++i) {
      const float y = widen(x[i], bf16) * MLAGATE_EXAMPLE_BUG_SCALE;
      x[i] = bf16 ? f32_to_bf16(y) : f32_to_f16(y);
    }
  }
  return status;
}

static mlagate_backend scaled_backend;
static mlagate_plugin scaled_plugin;

MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void) {
  scaled_plugin = *example_plugin_entry();
  scaled_backend = scaled_plugin.backends[0];
  scaled_backend.run = run_scaled;
  scaled_plugin.num_backends = 1;
  scaled_plugin.backends = &scaled_backend;
  return &scaled_plugin;
}
