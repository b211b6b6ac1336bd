// cpu.sparse as an ABI 1.2 plugin table (cpu_sparse_plugin.cpp): the sparse
// ops through the C ABI, bit-identical to the in-tree backend, with optional
// planted faults (a sparse bug, and the bad answers the loader must record).
#pragma once

#include "mlagate/plugin.h"

enum class SparseFault {
  kNone,
  kIgnoresTopkLength,  // a sparse kernel bug: every slot of a row read, past topk_length too
  kReadsInvalidIndex,  // a sparse kernel bug: -1 read as slot 0 instead of skipped
  kDenseShape,         // answers, then re-describes o as the dense op's [T, N, L] (V4 wants L + R)
  kUndeclaredDtype,    // answers, then re-describes o as float32, a dtype it never declared
  kWritesIndices,      // answers, then writes 0 into every -1 slot of its indices input
  kOldMinor,           // declares SPARSE_DECODE in a table built against ABI 1.1: refused at load
};

const mlagate_plugin* cpu_sparse_plugin_table(const char* name, SparseFault fault);
