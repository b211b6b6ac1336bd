// The exec backend (`--exec 'CMD {in} {out}'`): each kernel call becomes a case
// bundle HDF5 file, a run of the command with a time limit, and an outputs
// HDF5 file read back with every shape and dtype checked (SCHEMA.md). Any
// language can be a backend; a crash, a hang or a hostile outputs file is a
// record (CRASHED, TIMEOUT, INCORRECT), never the end of the run.
#pragma once

#include <string>

#include "backends/registry.h"

namespace mlagate {

struct ExecConfig {
  std::string name = "exec";  // backend name (letters, digits, . _ -)
  std::string command;        // shell command; {in} and {out} become the two files' quoted paths
  Capabilities caps;          // default_exec_caps() or parse_exec_caps()
  double timeout_s = 60;      // per invocation
};

// decode only, block size 16, VARLEN, threshold 1, bf16 and fp16, kv auto.
Capabilities default_exec_caps();
// "ops=decode,prefill block_sizes=16,64 query_len=VARLEN reorder_threshold=1
// dtypes=bf16,fp16 kv_dtypes=auto,fp8" (the format `mlagate list backends`
// prints); keys left out keep default_exec_caps()'s values. ops: decode,
// prefill, cache_write, sparse_decode, sparse_prefill; kv_dtypes: auto, fp8,
// fp8_e4m3, fp8_ds_mla, fp8_v4. Throws InputError.
Capabilities parse_exec_caps(const std::string& text);

// Checks the configuration (name, {in} and {out} in the command, timeout) and
// returns the registry entry. Throws InputError.
BackendEntry exec_backend_entry(const ExecConfig& cfg);

}  // namespace mlagate
