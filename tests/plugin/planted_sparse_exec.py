#!/usr/bin/env python3
"""examples/exec_python/sparse.py with one planted bug, chosen by MODE, for
tests/plugin/test_exec_sparse.cpp: each must be caught through the exec backend.

usage: planted_sparse_exec.py MODE BUNDLE.h5 OUTPUTS.h5

Kernel bugs (the sparse suites catch them as INCORRECT or NONFINITE):
  none                the example as it is
  ignore_topk_length  every slot of a row counts (reads the poisoned slots past topk_length)
  minus_one_as_slot0  sparse_decode reads index -1 as slot 0 (the null block, poisoned)
  drop_sink           the attention sink is left out of the denominator
Dense answers to a sparse op (INCORRECT naming the output and the rule):
  dense_answer        o_lat [T, N, L] and lse, the dense decode's outputs
  latent_only         o [T, N, L]: V4's value is the whole entry, L + R
  no_lse              o alone
  int_o               o stored as int32
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "exec_python"))
import sparse  # noqa: E402


def plant(mode):
    if mode == "none":
        return
    if mode == "ignore_topk_length":
        sparse.counted = lambda row, lengths, t: row
    elif mode == "minus_one_as_slot0":
        sparse.decode_slots = lambda row: np.where(row == -1, 0, row)
    elif mode == "drop_sink":
        sparse.sink_factor = lambda sink, lse: np.ones_like(lse)
    elif mode in ("dense_answer", "latent_only", "no_lse", "int_o"):
        def write(res, g, o, lse):
            L = int(g.attrs["kv_lora_rank"])  # V3.2: Dv = L; V4: Dv = L + R
            if mode == "dense_answer":
                res["o_lat"] = o[:, :, :L]
            elif mode == "latent_only":
                res["o"] = o[:, :, :L]
            else:
                res["o"] = o.astype(np.int32) if mode == "int_o" else o
            if mode != "no_lse":
                res["lse"] = lse

        sparse.write_outputs = write
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: planted_sparse_exec.py MODE BUNDLE.h5 OUTPUTS.h5")
    plant(sys.argv[1])
    sparse.main(sys.argv[2], sys.argv[3])
