#!/usr/bin/env python3
"""An mlagate exec backend in Python: MLA decode in numpy, fp32 throughout.

mlagate writes a case bundle (HDF5) per kernel call and runs this program:

    mlagate run --suite smoke \
        --exec 'python3 examples/exec_python/decode.py {in} {out}' --exec-name py.decode \
        --exec-caps 'ops=decode block_sizes=16,32 query_len=VARLEN reorder_threshold=1000000'

It takes strided views too (add strided_views=1 to --exec-caps, and run the
layout suite): q_lat and q_pe then come as their spans with NAME_strides,
and o_lat and lse are written in place into their spans (o_lat_span,
lse_span) and handed back whole, as a kernel writes into vLLM's output
slices (SCHEMA.md, "Strided views").

It reads every call of the bundle, computes the absorbed decode (SPEC: The
two paths, reference/SPEC.md) through the paged cache and writes o_lat and lse of each call to the
outputs file; calls of other ops get status "not_supported". The file formats
are documented in backends/exec/SCHEMA.md. Needs numpy and h5py (Debian:
python3-numpy python3-h5py).
"""
import sys

import h5py
import numpy as np


def text(x):
    """An HDF5 string attribute as str (fixed-length ones come back as bytes)."""
    return x.decode() if isinstance(x, (bytes, np.bytes_)) else str(x)


def widen(bits, dtype):
    """16-bit model-dtype bits (uint16) -> float32, exactly."""
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float32)
    raise ValueError(f"unexpected model dtype {dtype}")


def e4m3fn_table():
    """The 256 e4m3fn codes as float32 (0x7F and 0xFF are NaN; no infinities)."""
    t = np.empty(256, np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 15 and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = sign * m * 2.0 ** -9
        else:
            t[b] = sign * (1 + m / 8) * 2.0 ** (e - 7)
    return t


def keys_of(g, cache, slots):
    """Cache entries at `slots` as float32 [n, L + R], dequantized (SCHEMA.md: entry layouts)."""
    L, R = int(g.attrs["kv_lora_rank"]), int(g.attrs["rope_dim"])
    kv = cache.reshape(-1, cache.shape[-1])[slots]
    kind, dtype = text(g.attrs["kv_cache_dtype"]), text(g.attrs["dtype"])
    if kind == "auto":
        return widen(kv.view(np.uint16), dtype)
    table = e4m3fn_table()
    if kind in ("fp8", "fp8_e4m3"):
        return table[kv[:, : L + R]] * np.float32(g.attrs["k_scale"])
    if kind == "fp8_ds_mla":
        so, sc, po = int(g.attrs["scale_offset"]), int(g.attrs["scale_count"]), int(g.attrs["k_pe_offset"])
        scales = np.ascontiguousarray(kv[:, so : so + 4 * sc]).view(np.float32)
        kv_c = table[kv[:, :L]] * np.repeat(scales, L // sc, axis=1)
        k_pe = widen(np.ascontiguousarray(kv[:, po : po + 2 * R]).view(np.uint16), "bfloat16")
        return np.concatenate([kv_c, k_pe], axis=1)
    raise ValueError(f"unexpected kv cache dtype {kind}")


def tensor(g, name, shape):
    """Input `name` of a call: a dataset of its shape, or (strided_views) its
    span with NAME_strides, viewed through those strides in elements."""
    data = g[name][()]
    if name + "_strides" not in g:
        return data
    strides = [int(s) * data.itemsize for s in g[name + "_strides"][()]]
    return np.lib.stride_tricks.as_strided(data, shape=shape, strides=strides, writeable=False)


def narrow(x, dtype):
    """float32 -> 16-bit model-dtype bits (uint16), round to nearest even."""
    if dtype == "float16":
        return x.astype(np.float16).view(np.uint16)
    x = np.ascontiguousarray(x, np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    bits = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), bits)  # a NaN stays NaN (rounding would carry it to inf)


def decode(g):
    """One decode call: o_lat [T, N, L], lse [T, N] in float32."""
    dtype = text(g.attrs["dtype"])
    L, bs, scale = int(g.attrs["kv_lora_rank"]), int(g.attrs["block_size"]), np.float32(g.attrs["scale"])
    T, N, R = int(g.attrs["num_tokens"]), int(g.attrs["num_heads"]), int(g.attrs["rope_dim"])
    q_lat, q_pe = tensor(g, "q_lat", (T, N, L)), tensor(g, "q_pe", (T, N, R))
    q = np.concatenate([widen(q_lat, dtype), widen(q_pe, dtype)], axis=-1)  # [T, N, L + R]
    cache, table = g["kv_cache"][()], g["block_table"][()]
    seq_lens, qsl = g["seq_lens"][()], g["query_start_loc"][()]
    T, N = q.shape[0], q.shape[1]
    o_lat = np.zeros((T, N, L), np.float32)
    lse = np.full((T, N), -np.inf, np.float32)
    for b, s in enumerate(seq_lens):
        q0, q1 = int(qsl[b]), int(qsl[b + 1])
        if s == 0 or q1 == q0:
            continue  # a padding request sees no key: o_lat 0, lse -inf
        pos = np.arange(s)
        k = keys_of(g, cache, table[b, pos // bs].astype(np.int64) * bs + pos % bs)  # [s, L + R]
        logits = scale * np.einsum("tnd,sd->tns", q[q0:q1], k)
        # Query u of the request sees keys 0 .. s - q_len + u (the causal rule).
        visible = pos[None, :] < (s - (q1 - q0) + np.arange(q1 - q0) + 1)[:, None]
        logits = np.where(visible[:, None, :], logits, -np.inf)
        m = logits.max(axis=-1, keepdims=True)
        p = np.exp(logits - m)
        l = p.sum(axis=-1, keepdims=True)
        o_lat[q0:q1] = np.einsum("tns,sd->tnd", p, k[:, :L]) / l
        lse[q0:q1] = (m + np.log(l))[..., 0]
    return o_lat, lse


def main(bundle_path, outputs_path):
    with h5py.File(bundle_path, "r") as bundle, h5py.File(outputs_path, "w") as out:
        assert text(bundle.attrs["schema"]) == "mlagate.exec.bundle", "not an mlagate bundle"
        for name, g in bundle["calls"].items():
            res = out.create_group(f"calls/{name}")
            op = text(g.attrs["op"])
            if op != "decode":
                res.attrs["status"] = "not_supported"
                res.attrs["message"] = f"decode.py implements decode, not {op}"
                continue
            o_lat, lse = decode(g)
            if "o_lat_span" in g:  # strided outputs: written in place, the whole spans handed back
                dtype = text(g.attrs["dtype"])
                span = g["o_lat_span"][()].copy()  # model-dtype bits, padding as mlagate left it
                st = [int(s) * span.itemsize for s in g["o_lat_span_strides"][()]]
                np.lib.stride_tricks.as_strided(span, o_lat.shape, st)[...] = narrow(o_lat, dtype)
                res["o_lat"] = span
                res["o_lat"].attrs["dtype"] = g["o_lat_span"].attrs["dtype"]
            else:
                res["o_lat"] = o_lat  # float32: mlagate rounds it to the model dtype
            if "lse_span" in g:
                span = g["lse_span"][()].copy()
                st = [int(s) * span.itemsize for s in g["lse_span_strides"][()]]
                np.lib.stride_tricks.as_strided(span, lse.shape, st)[...] = lse
                res["lse"] = span
            else:
                res["lse"] = lse


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: decode.py BUNDLE.h5 OUTPUTS.h5")
    main(sys.argv[1], sys.argv[2])
