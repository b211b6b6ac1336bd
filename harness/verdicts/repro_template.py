#!/usr/bin/env python3
# Written by `mlagate triage` (harness/verdicts/VERDICTS.md): shows the
# mismatch of one record without mlagate. It reads the golden bundle (the
# case's inputs, paged cache and fp64 reference, HDF5 schema in
# golden/SCHEMA.md) and the results file (the kernel's outputs as it wrote
# them) with h5py and numpy alone, and prints, per output, the non-finite
# elements and the largest errors with their (token, head, dim) positions.
# Usage: python3 repro.py [BUNDLE.h5 RESULTS.h5]
import sys

import h5py
import numpy as np

BUNDLE = "@BUNDLE@"
RESULTS = "@RESULTS@"
CASE_ID = "@CASE_ID@"
BACKEND = "@BACKEND@"
OP = "@OP@"

# The reference each output of each op is judged against.
REFERENCE = {
    ("layer", "out"): "golden/out", ("layer", "lse"): "golden/lse",
    ("prefill", "out"): "golden/out", ("prefill", "lse"): "golden/lse",
    ("decode", "o_lat"): "decode/o_lat", ("decode", "lse"): "decode/lse",
    ("sparse_decode", "o"): "sparse/o", ("sparse_decode", "lse"): "sparse/lse",
    ("sparse_prefill", "o"): "sparse/o", ("sparse_prefill", "lse"): "sparse/lse",
}


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def values(ds):
    """A dataset as float64, whatever bits it stores (bf16 and fp16 are raw uint16)."""
    kind = text(ds.attrs.get("dtype", b""))
    raw = ds[()]
    if kind == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if kind == "float16":
        return raw.view(np.float16).astype(np.float64)
    return raw.astype(np.float64)


def main():
    bundle = sys.argv[1] if len(sys.argv) > 2 else BUNDLE
    results = sys.argv[2] if len(sys.argv) > 2 else RESULTS
    with h5py.File(bundle, "r") as g, h5py.File(results, "r") as r:
        case = g["cases/" + CASE_ID]
        heads = int(case.attrs["num_heads"])
        qlens = case["query_lens"][()]
        starts = np.concatenate([[0], np.cumsum(qlens)])
        print(f"case {CASE_ID}")
        print(f"  {len(qlens)} requests, query lens {qlens.tolist()}, seq lens {case['seq_lens'][()].tolist()}, "
              f"{heads} heads, kv cache {text(case.attrs['kv_cache_dtype'])}, k_scale {float(case.attrs['k_scale'])!r}")
        got_group = r["cases/" + CASE_ID + "/results/" + BACKEND + "/" + OP]
        print(f"{BACKEND} {OP}: {text(got_group.attrs['status'])}: {text(got_group.attrs['message'])}")
        failed = False
        for name in got_group:
            ref_path = REFERENCE.get((OP, name))
            if ref_path is None or ref_path not in case:
                continue
            want = values(case[ref_path])
            got = values(got_group[name]).reshape(want.shape)
            t = want.shape[0]
            w = want.reshape(t, heads, -1)
            x = got.reshape(t, heads, -1)
            # Rows with no key: the reference is -inf (lse) or 0; either infinity is accepted for lse.
            both_inf = np.isinf(w) & np.isinf(x)
            bad_nonfinite = ~np.isfinite(x) & ~both_inf
            err = np.where(np.isfinite(x) & np.isfinite(w), np.abs(x - w), 0.0)
            print(f"  {name}: shape {tuple(want.shape)}, {int(bad_nonfinite.sum())} non-finite where the reference "
                  f"is finite, max abs error {err.max():.6g}")
            if bad_nonfinite.any():
                failed = True
                tok, head, dim = np.argwhere(bad_nonfinite)[0]
                req = int(np.searchsorted(starts, tok, side="right") - 1)
                print(f"    first non-finite: request {req}, token {tok - starts[req]}, head {head}, dim {dim}: "
                      f"got {x[tok, head, dim]!r}, expected {w[tok, head, dim]!r}")
            order = np.argsort(err, axis=None)[::-1][:5]
            for flat in order:
                tok, head, dim = np.unravel_index(flat, err.shape)
                if err[tok, head, dim] == 0:
                    break
                req = int(np.searchsorted(starts, tok, side="right") - 1)
                print(f"    request {req}, token {tok - starts[req]}, head {head}, dim {dim}: "
                      f"got {x[tok, head, dim]:.8g}, expected {w[tok, head, dim]:.8g}, error {err[tok, head, dim]:.3g}")
            failed = failed or err.max() > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
