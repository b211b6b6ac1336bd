// The per-library part of the test plugins: the backend's name, the planted
// fault (MLAGATE_TEST_PLUGIN_NAME, MLAGATE_TEST_PLUGIN_FAULT: a PlantedFault
// enumerator) and the exported entry symbol.
#include "tests/plugin/cpu_paged_plugin.h"

#define MLAGATE_TEST_FAULT PlantedFault::MLAGATE_TEST_PLUGIN_FAULT

#ifdef MLAGATE_TEST_PLUGIN_NO_ENTRY
extern "C" MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry_misspelled(void) {
  return cpu_paged_plugin_table(MLAGATE_TEST_PLUGIN_NAME, MLAGATE_TEST_FAULT);
}
#else
extern "C" const mlagate_plugin* mlagate_plugin_entry(void) {
  try {
    return cpu_paged_plugin_table(MLAGATE_TEST_PLUGIN_NAME, MLAGATE_TEST_FAULT);
  } catch (...) {
    return nullptr;  // refuses the load
  }
}
#endif
