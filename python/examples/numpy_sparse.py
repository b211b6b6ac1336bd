"""DeepSeek V3.2 / V4 sparse prefill in numpy (FlashMLA's flash_mla_sparse_fwd), run through mlagate's
Python module: a sparse kernel reaches the harness in a few lines of Python, and the CI's proof that a
sparse bug is caught that way.

    PYTHONPATH=build/cpu/python python3 python/examples/numpy_sparse.py --suite sparse
    PYTHONPATH=build/cpu/python python3 python/examples/numpy_sparse.py --suite v4

Each query token t attends to the rows of the flat kv array its index row names (only the first
topk_length[t] slots when lengths are given; -1 and any index >= S_kv name none; duplicates count
twice); a key is the whole row, its value the first Dv elements (Dv = L for V3.2, L + R for V4); the
per-head sink joins the softmax denominator with no value and stays out of lse (reference/SPARSE.md).
MLAGATE_EXAMPLE_PLANT=topk_length plants a bug: every slot of a row read, past topk_length too.
"""

import os
import sys

import numpy as np

import mlagate

PLANT = os.environ.get("MLAGATE_EXAMPLE_PLANT", "")


def sparse_prefill(a):
    q = np.asarray(a.q, np.float64)     # [T, N, D]
    kv = np.asarray(a.kv, np.float64)   # [S, D]
    idx = np.asarray(a.indices)         # [T, K]
    lens = None if a.topk_length is None else np.asarray(a.topk_length)
    sink = None if a.sink is None else np.asarray(a.sink, np.float64)
    T, N, _ = q.shape
    S, K, Dv = kv.shape[0], idx.shape[1], a.o.shape[-1]
    o = np.zeros((T, N, Dv), np.float64)
    lse = np.full((T, N), -np.inf, np.float64)
    for t in range(T):
        count = K if lens is None or PLANT == "topk_length" else int(lens[t])
        sel = idx[t, :count]
        sel = sel[(sel >= 0) & (sel < S)]
        if sel.size == 0:
            continue  # no key: o = 0, lse = -inf
        keys = kv[sel]                                  # [k, D]
        logits = a.scale * q[t] @ keys.T                # [N, k]
        m = logits.max(axis=-1, keepdims=True)
        p = np.exp(logits - m)
        den = p.sum(axis=-1, keepdims=True)
        row_lse = (m + np.log(den))[:, 0]
        out = (p @ keys[:, :Dv]) / den
        if sink is not None:
            out *= (1.0 / (1.0 + np.exp(sink - row_lse)))[:, None]
        o[t], lse[t] = out, row_lse
    return {"o": o, "lse": lse}


# The kv rows come dequantized to the model dtype whatever the cache held: every kv dtype and block size.
BACKEND = mlagate.Backend(sparse_prefill=sparse_prefill, framework="numpy", block_sizes=(64, 1, 16, 128, 256),
                          kv_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_ds_mla", "fp8_v4"),
                          description="numpy sparse prefill (python/examples/numpy_sparse.py)")

if __name__ == "__main__":
    argv = sys.argv[1:]
    result = mlagate.run({"numpy.sparse": BACKEND}, argv=argv if "--op" in argv else argv + ["--op", "sparse_prefill"])
    sys.exit(result.exit_code)
