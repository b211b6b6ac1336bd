// The per-library part of the test plugins: the backend's name, the table
// (cpu.paged's, or cpu.sparse's with MLAGATE_TEST_SPARSE_PLUGIN), the planted
// fault (MLAGATE_TEST_PLUGIN_FAULT: an enumerator of the table's fault enum)
// and the exported entry symbol.
#include "tests/plugin/cpu_paged_plugin.h"
#include "tests/plugin/cpu_sparse_plugin.h"

#ifdef MLAGATE_TEST_SPARSE_PLUGIN
#define MLAGATE_TEST_TABLE() cpu_sparse_plugin_table(MLAGATE_TEST_PLUGIN_NAME, SparseFault::MLAGATE_TEST_PLUGIN_FAULT)
#else
#define MLAGATE_TEST_TABLE() cpu_paged_plugin_table(MLAGATE_TEST_PLUGIN_NAME, PlantedFault::MLAGATE_TEST_PLUGIN_FAULT)
#endif

#ifdef MLAGATE_TEST_PLUGIN_NO_ENTRY
extern "C" MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry_misspelled(void) {
  return MLAGATE_TEST_TABLE();
}
#else
extern "C" const mlagate_plugin* mlagate_plugin_entry(void) {
  try {
    return MLAGATE_TEST_TABLE();
  } catch (...) {
    return nullptr;  // refuses the load
  }
}
#endif
