"""An MLA decode written in torch (any device), through mlagate's Python module: what the
five-line promise looks like for a torch or Triton kernel.

    PYTHONPATH=build/cpu/python python3 python/examples/torch_mla.py --suite smoke            # CPU
    PYTHONPATH=build/cuda/python python3 python/examples/torch_mla.py --suite vllm --device cuda

The kernel gathers each request's cache rows through the block table and computes attention in
float32, writing the outputs in place (a.o_lat, a.lse), as a kernel launch with out= does.
"""

import sys

import torch

import mlagate


def decode(a):
    L = a.q_lat.shape[-1]
    bs = a.block_size
    q = torch.cat([a.q_lat, a.q_pe], dim=-1).float()               # [T, N, L + R]
    cache = a.kv_cache.reshape(-1, a.kv_cache.shape[-1])           # [slots, L + R]
    seq_lens, qsl, table = a.seq_lens.tolist(), a.query_start_loc.tolist(), a.block_table
    for i, s in enumerate(seq_lens):
        t0, t1 = qsl[i], qsl[i + 1]
        if t1 == t0 or s == 0:  # no query (padding) or no key: o = 0, lse = -inf
            a.o_lat[t0:t1] = 0
            a.lse[t0:t1] = float("-inf")
            continue
        pos = torch.arange(s, device=q.device)
        slots = table[i, pos // bs].long() * bs + pos % bs
        kv = cache[slots].float()                                   # [s, L + R]
        logits = a.scale * torch.einsum("tnd,sd->tns", q[t0:t1], kv)
        last = s - (t1 - t0) + torch.arange(t1 - t0, device=q.device)
        logits = logits.masked_fill(pos[None, None, :] > last[:, None, None], float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)                       # [q, N]; -inf where a token sees no key
        p = torch.where(torch.isfinite(lse)[..., None], torch.exp(logits - lse[..., None]), 0.0)
        a.o_lat[t0:t1] = torch.einsum("tns,sl->tnl", p, kv[:, :L]).to(a.o_lat.dtype)
        a.lse[t0:t1] = lse


def backend(device: str = "cpu") -> mlagate.Backend:
    return mlagate.Backend(decode=decode, framework="torch", device=device, block_sizes=(16, 64),
                           description=f"torch decode on {device} (python/examples/torch_mla.py)")


if __name__ == "__main__":
    argv = sys.argv[1:]
    device = "cpu"
    if "--device" in argv:
        i = argv.index("--device")
        device = argv[i + 1]
        del argv[i:i + 2]
    result = mlagate.run({f"torch.{device}": backend(device)}, argv=argv if "--op" in argv else argv + ["--op", "decode"])
    sys.exit(result.exit_code)
