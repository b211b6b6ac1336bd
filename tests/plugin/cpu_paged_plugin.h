// cpu.paged as a plugin table (cpu_paged_plugin.cpp), with an optional planted
// fault; plugin_entry.cpp exports it from each test library. The table is ABI
// 1.1: its decode is capturable (graph_ops) and has a prepare() whose schedule
// (the call's seq_lens) run() checks, so a call or replay without its own
// prepare() is an error.
#pragma once

#include "mlagate/plugin.h"

enum class PlantedFault {
  kNone,
  kBadAbi,       // abi_version 99
  kNullRun,      // run is NULL
  kThrows,       // decode throws a C++ exception across the boundary
  kNan,          // decode writes one NaN into o_lat
  kOutOfBounds,  // decode writes one element past the end of o_lat
  kRedescribeShape,   // decode answers correctly, then rewrites o_lat's descriptor: shape [T, N, L-1]
  kRedescribeDtype,   // ... o_lat's dtype float32
  kRedescribeDevice,  // ... o_lat's device cuda:0
  kNoEntry,      // the entry symbol is missing (plugin_entry.cpp exports a misspelled one)
  kPrepareFails, // prepare() returns MLAGATE_STATUS_ERROR
  kAbi10,        // the tables laid out as ABI 1.0 (no graph_ops, prepare, abi_minor): two backends
  kNewerMinor,   // abi_minor one past this header's
  kLayouts,      // not a fault: declares ABI 1.3's strided_views and a 1 TiB max_pool_bytes, and honours strides
  kGarbageMinor, // abi_minor as an unzeroed table held it in the report (1802464627)
  kAbi11,        // built against the 1.1 header: abi_minor 1 (1.2 changed no struct it hands over)
};

// The library's table, built on first call (one per library: the state is static).
const mlagate_plugin* cpu_paged_plugin_table(const char* name, PlantedFault fault);
