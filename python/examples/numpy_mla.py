"""A reference MLA decode kernel in numpy, run through mlagate's Python module: the CI's proof that a
Python kernel reaches the harness in a few lines, and a template for your own.

    PYTHONPATH=build/cpu/python python3 python/examples/numpy_mla.py --suite smoke

It reads the paged cache through the block table, as a kernel does: bf16/fp16 entries (kv=auto) or
e4m3 bytes times k_scale (kv=fp8, fp8_e4m3); every query token u of a request with q new tokens and
s keys sees keys 0 .. s - q + u; it returns float64 outputs, which mlagate rounds to the model dtype.
"""

import sys

import numpy as np

import mlagate


def _e4m3_table() -> np.ndarray:
    """The 256 values of float8 e4m3fn (bias 7, no infinities, 0x7f/0xff NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    v = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    v = sign * v
    v[(b & 0x7F) == 0x7F] = np.nan
    return v


E4M3 = _e4m3_table()


def cache_rows(a, slots: np.ndarray) -> np.ndarray:
    """Entries [kv_c | k_pe] of the given slots, as float64."""
    cache = a.kv_cache
    flat = cache.reshape(-1, cache.shape[-1])[slots]
    if a.kv_cache_dtype == "auto":
        return flat.astype(np.float64)
    if a.kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return E4M3[flat] * float(a.k_scale)
    raise mlagate.NotSupported(f"kv cache dtype {a.kv_cache_dtype}")


def decode(a):
    q = np.concatenate([a.q_lat, a.q_pe], axis=-1).astype(np.float64)  # [T, N, L + R]
    L = a.q_lat.shape[-1]
    bs = a.block_size
    o = np.zeros(a.o_lat.shape, np.float64)
    lse = np.full(a.lse.shape, -np.inf, np.float64)
    for i, s in enumerate(a.seq_lens):
        t0, t1 = a.query_start_loc[i], a.query_start_loc[i + 1]
        if t1 == t0 or s == 0:
            continue  # no query (padding) or no key: o = 0, lse = -inf
        pos = np.arange(s)
        slots = a.block_table[i, pos // bs].astype(np.int64) * bs + pos % bs
        kv = cache_rows(a, slots)                                  # [s, L + R]
        logits = a.scale * np.einsum("tnd,sd->tns", q[t0:t1], kv)  # [q, N, s]
        visible = pos[None, :] <= (s - (t1 - t0) + np.arange(t1 - t0))[:, None]
        logits = np.where(visible[:, None, :], logits, -np.inf)
        m = logits.max(axis=-1, keepdims=True)
        seen = np.isfinite(m)  # a token that sees no key (q_len > seq_len: graph padding) keeps o = 0, lse = -inf
        p = np.exp(logits - np.where(seen, m, 0.0))
        denom = p.sum(axis=-1, keepdims=True)
        w = np.divide(p, denom, out=np.zeros_like(p), where=seen)
        o[t0:t1] = np.einsum("tns,sl->tnl", w, kv[:, :L])
        lse[t0:t1] = np.where(seen, m + np.log(np.where(seen, denom, 1.0)), -np.inf)[..., 0]
    return {"o_lat": o, "lse": lse}


BACKEND = mlagate.Backend(decode=decode, framework="numpy", block_sizes=(16, 64),
                          kv_dtypes=("auto", "fp8", "fp8_e4m3"), query_len_support="varlen",
                          description="numpy reference decode (python/examples/numpy_mla.py)")

if __name__ == "__main__":
    # Any `mlagate run` flag after the script's name: --suite smoke --op decode --junit out.xml ...
    argv = sys.argv[1:]
    result = mlagate.run({"numpy.mla": BACKEND}, argv=argv if "--op" in argv else argv + ["--op", "decode"])
    sys.exit(result.exit_code)
