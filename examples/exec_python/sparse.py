#!/usr/bin/env python3
"""An mlagate exec backend in Python: DeepSeek V3.2 / V4 sparse attention in numpy, fp32.

mlagate writes a case bundle (HDF5) per kernel call and runs this program:

    mlagate run --suite sparse,v4 \
        --exec 'python3 examples/exec_python/sparse.py {in} {out}' --exec-name py.sparse \
        --exec-caps 'ops=sparse_decode,sparse_prefill block_sizes=64,1,16 kv_dtypes=auto,fp8_ds_mla,fp8_v4'

It reads every call of the bundle and computes the sparse ops of
reference/SPARSE.md: `sparse_decode` over the paged cache (V3.2's top-k rows,
V4's sliding window plus the compressed cache's rows, every cache format) and
`sparse_prefill` over the flat workspace, with the per-head sink; it writes o
and lse of each call to the outputs file. Calls of other ops get status
"not_supported". The file formats are in backends/exec/SCHEMA.md. Needs numpy
and h5py (Debian: python3-numpy python3-h5py).

Each rule is one small function (counted, decode_slots, prefill_slots,
sink_factor, write_outputs), so that tests/plugin/planted_sparse_exec.py can
plant one bug at a time.
"""
import sys

import h5py
import numpy as np


# The bundle's strings, 16-bit model values and e4m3fn codes are read as the
# dense example reads them (this folder is on sys.path when either runs).
from decode import e4m3fn_table, text, widen  # noqa: E402

E4M3 = e4m3fn_table()


def entries(g, prefix, slots):
    """The raw entries of global `slots` of the paged cache `{prefix}kv_cache` as uint8 [n, entry_bytes],
    in the entry's logical order (fp8_v4: the page's data bytes of the token, then its scale bytes)."""
    cache = g[prefix + "kv_cache"]
    bs = int(g.attrs[prefix + "block_size"])
    eb = int(g.attrs[prefix + "entry_bytes"])
    db = int(g.attrs["entry_data_bytes"])  # the extra cache has the main cache's format
    pages = cache[()].reshape(cache.shape[0], -1)  # [num_blocks, block_bytes]
    blk, off = (slots // bs)[:, None], (slots % bs)[:, None]
    if db == eb:  # contiguous entries
        return pages[blk, off * eb + np.arange(eb)]
    tail = eb - db  # fp8_v4: data region, then scale region, per page
    data = pages[blk, off * db + np.arange(db)]
    scales = pages[blk, bs * db + off * tail + np.arange(tail)]
    return np.concatenate([data, scales], axis=1)


def dequantize(g, e):
    """Entries uint8 [n, entry_bytes] -> float32 keys [n, L + R] (SCHEMA.md: cache entry layouts)."""
    L, R = int(g.attrs["kv_lora_rank"]), int(g.attrs["rope_dim"])
    kind, dtype = text(g.attrs["kv_cache_dtype"]), text(g.attrs["dtype"])
    e = np.ascontiguousarray(e)
    if kind == "auto":
        return widen(e.view(np.uint16), dtype)
    if kind in ("fp8", "fp8_e4m3"):
        return E4M3[e[:, : L + R]] * np.float32(g.attrs["k_scale"])
    so, sc, po = int(g.attrs["scale_offset"]), int(g.attrs["scale_count"]), int(g.attrs["k_pe_offset"])
    if kind == "fp8_ds_mla":
        scales = np.ascontiguousarray(e[:, so : so + 4 * sc]).view(np.float32)
    elif kind == "fp8_v4":
        u = e[:, so : so + sc].astype(np.int32)  # UE8M0: 2^(u - 127), 0xFF is NaN
        scales = np.where(u == 255, np.float32(np.nan), np.ldexp(np.float32(1), u - 127).astype(np.float32))
    else:
        raise ValueError(f"unexpected kv cache dtype {kind}")
    kv_c = E4M3[e[:, :L]] * np.repeat(scales, L // sc, axis=1)
    k_pe = widen(np.ascontiguousarray(e[:, po : po + 2 * R]).view(np.uint16), "bfloat16")
    return np.concatenate([kv_c, k_pe], axis=1).astype(np.float32)


def counted(row, lengths, t):
    """The slots of a row that count: the first topk_length[t] when lengths are given."""
    return row if lengths is None else row[: lengths[t]]


def decode_slots(row):
    """sparse_decode: -1 names no key (FlashMLA's sparse decode defines only -1)."""
    return row[row != -1]


def prefill_slots(row, s_kv):
    """sparse_prefill: -1 and any index >= s_kv name no key."""
    return row[(row >= 0) & (row < s_kv)]


def sink_factor(sink, lse):
    """The sink's share of the denominator: o shrinks by 1 / (1 + exp(sink - lse)) per head."""
    if sink is None:
        return np.ones_like(lse)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(sink - lse))


def attend(q, keys, dv, scale, sink):
    """q [N, D], keys [n, D] (duplicates count twice) -> o [N, dv], lse [N]; no key: o 0, lse +inf."""
    N = q.shape[0]
    if keys.shape[0] == 0:
        return np.zeros((N, dv), np.float32), np.full(N, np.inf, np.float32)
    logits = scale * (q @ keys.T)  # [N, n]
    m = logits.max(axis=1, keepdims=True)
    p = np.exp(logits - m)
    s = p.sum(axis=1, keepdims=True)
    lse = (m + np.log(s))[:, 0]
    o = (p @ keys[:, :dv]) / s
    return o * sink_factor(sink, lse)[:, None], lse


def optional(g, name):
    return g[name][()] if name in g else None


def sparse_decode(g):
    """One sparse_decode call: o [T, N, Dv], lse [T, N] in float32."""
    dtype = text(g.attrs["dtype"])
    q = widen(g["q"][()], dtype)  # [T, N, L + R]
    T, N = q.shape[0], q.shape[1]
    dv, scale = int(g.attrs["v_head_dim"]), np.float32(g.attrs["scale"])
    bs, window = int(g.attrs["block_size"]), int(g.attrs["window"])
    seq_lens, qsl, table = g["seq_lens"][()], g["query_start_loc"][()], g["block_table"][()]
    indices, lengths = optional(g, "indices"), optional(g, "topk_length")
    extra = int(g.attrs["extra_num_blocks"]) > 0
    x_indices, x_lengths = optional(g, "extra_indices"), optional(g, "extra_topk_length")
    sink = optional(g, "sink")
    o = np.zeros((T, N, dv), np.float32)
    lse = np.full((T, N), np.inf, np.float32)
    for b, s in enumerate(seq_lens):
        first, qlen = int(qsl[b]), int(qsl[b + 1] - qsl[b])
        for u in range(qlen):
            t = first + u
            main = np.zeros(0, np.int64)
            if indices is not None:  # V3.2: the token's top-k row
                main = decode_slots(counted(indices[t], lengths, t)).astype(np.int64)
            elif window > 0 and s > 0:  # V4: the window's positions through the block table
                p = int(s) - qlen + u
                pos = np.arange(max(0, p - window + 1), p + 1)
                main = table[b, pos // bs].astype(np.int64) * bs + pos % bs
            keys = dequantize(g, entries(g, "", main))
            if extra and x_indices is not None:  # V4: the compressed cache's row
                xs = decode_slots(counted(x_indices[t], x_lengths, t)).astype(np.int64)
                keys = np.concatenate([keys, dequantize(g, entries(g, "extra_", xs))])
            o[t], lse[t] = attend(q[t], keys, dv, scale, sink)
    return o, lse


def sparse_prefill(g):
    """One sparse_prefill call over the workspace kv [S_kv, D]: o [T, N, Dv], lse [T, N]."""
    dtype = text(g.attrs["dtype"])
    q, kv = widen(g["q"][()], dtype), widen(g["kv"][()], dtype)
    T, N = q.shape[0], q.shape[1]
    dv, scale, s_kv = int(g.attrs["v_head_dim"]), np.float32(g.attrs["scale"]), kv.shape[0]
    indices, lengths, sink = g["indices"][()], optional(g, "topk_length"), optional(g, "sink")
    o = np.zeros((T, N, dv), np.float32)
    lse = np.full((T, N), np.inf, np.float32)
    for t in range(T):
        rows = prefill_slots(counted(indices[t], lengths, t), s_kv)
        o[t], lse[t] = attend(q[t], kv[rows], dv, scale, sink)
    return o, lse


def write_outputs(res, g, o, lse):
    """Call g's o as float32 (mlagate rounds it to the model dtype) and lse."""
    res["o"] = o
    res["lse"] = lse


def main(bundle_path, outputs_path):
    with h5py.File(bundle_path, "r") as bundle, h5py.File(outputs_path, "w") as out:
        if int(bundle.attrs["schema_version"]) > 2:
            sys.exit(f"bundle schema version {bundle.attrs['schema_version']} is newer than this program's 2")
        for name, g in bundle["calls"].items():
            res = out.create_group(f"calls/{name}")
            op = text(g.attrs["op"])
            if op == "sparse_decode":
                write_outputs(res, g, *sparse_decode(g))
            elif op == "sparse_prefill":
                write_outputs(res, g, *sparse_prefill(g))
            else:
                res.attrs["status"] = "not_supported"
                res.attrs["message"] = f"this program implements sparse_decode and sparse_prefill, not {op}"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: sparse.py BUNDLE.h5 OUTPUTS.h5")
    main(sys.argv[1], sys.argv[2])
