"""vLLM's Triton MLA decode kernel (the TRITON_MLA backend's) under mlagate, from your vLLM checkout.

    PYTHONPATH=build/cuda/python python3 python/examples/vllm_triton_mla.py \\
        --vllm ~/src/vllm --suite vllm --op decode,layer --junit triton.xml

--vllm: a vLLM checkout (or the kernel file itself, triton_decode_attention.py). The kernel is loaded
from that file alone: where vLLM is not importable (not built, as a bare checkout is), its two imports
(vllm.platforms.current_platform.is_rocm, vllm.triton_utils.{triton, tl}) are stood in for by the
small modules below. Nothing of vLLM is part of mlagate.

The backend is TRITON_MLA's decode as vLLM calls it: q = [q_lat | q_pe], the paged cache as k_buffer
[blocks, block_size, 1, L+R] and its first L columns as v_buffer, a float32 split buffer
[B, N, splits, L+1], the block table, seq_lens and the block size as page size; single-token decodes
(vLLM's QueryLenSupport.SINGLE_ONLY). What the loaded kernel file takes decides the rest, as it did in
vLLM at that file's commit:
- a kernel with `k_scale` (newer vLLM: the kernel dequantizes fp8 caches itself, USE_FP8) declares kv
  cache dtypes auto, fp8 and fp8_e4m3, and is called as TritonMLAImpl calls it: the cache viewed as
  float8_e4m3fn, k_scale a one-element float32 tensor (the layer's _k_scale, used for K and V alike),
  num_kv_splits 4;
- an older kernel (with `is_mla`) declares auto only (vLLM raised "FP8 Triton MLA not yet supported")
  and gets is_mla=True and the split count of that vLLM (next power of two of max_seq_len * B / 256).
The layer op routes prefill requests to a torch attention with the bottom-right causal rule (vLLM's
prefill is FlashAttention; here it is only the other half of the layer).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys
import types

import torch

import mlagate


def _stand_in_vllm() -> None:
    """Minimal stand-ins for the two vLLM modules the kernel file imports, when vLLM is not importable."""
    try:
        import vllm.platforms  # noqa: F401, PLC0415
        import vllm.triton_utils  # noqa: F401, PLC0415
        return
    except Exception:  # noqa: BLE001 - a bare checkout is not importable
        pass
    import triton  # noqa: PLC0415
    vllm = types.ModuleType("vllm")
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_rocm=lambda: torch.version.hip is not None,
                                                       is_cuda=lambda: torch.version.cuda is not None)
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.triton, triton_utils.tl = triton, triton.language
    vllm.platforms, vllm.triton_utils = platforms, triton_utils
    sys.modules.update({"vllm": vllm, "vllm.platforms": platforms, "vllm.triton_utils": triton_utils})


def load_kernel(where: str):
    """decode_attention_fwd from a vLLM checkout (either of its historical paths) or the file itself."""
    candidates = [where] if where.endswith(".py") else [
        os.path.join(where, "vllm", "v1", "attention", "ops", "triton_decode_attention.py"),
        os.path.join(where, "vllm", "attention", "ops", "triton_decode_attention.py")]
    path = next((p for p in candidates if os.path.isfile(p)), None)
    if path is None:
        raise SystemExit(f"no triton_decode_attention.py under {where} (tried {', '.join(candidates)})")
    _stand_in_vllm()
    spec = importlib.util.spec_from_file_location("vllm_triton_decode_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.decode_attention_fwd, path


decode_attention_fwd = None  # set by main() (and again in each isolation worker: see _ensure_kernel)


def _ensure_kernel() -> None:
    global decode_attention_fwd
    if decode_attention_fwd is None:
        decode_attention_fwd, _ = load_kernel(os.environ["MLAGATE_VLLM"])


def kernel_takes(name: str) -> bool:
    """Whether the loaded decode_attention_fwd has that parameter (k_scale: fp8 in the kernel)."""
    _ensure_kernel()
    return name in inspect.signature(decode_attention_fwd).parameters


def _num_kv_splits(batch: int, max_seq_len: int) -> int:
    """Older TRITON_MLA's choice: the next power of two of max_seq_len * B / 256, at most 2x the SMs
    (newer vLLM passes 4)."""
    n = max(1, max_seq_len * batch // 256)
    p = 1 << (n - 1).bit_length()
    return min(p, 2 * torch.cuda.get_device_properties(0).multi_processor_count)


def triton_decode(a):
    _ensure_kernel()
    L = a.q_lat.shape[-1]
    B = a.seq_lens.shape[0]
    N = a.q_lat.shape[1]
    if a.q_lat.shape[0] != B:
        raise mlagate.NotSupported("TRITON_MLA decodes one token per request")
    q = torch.cat([a.q_lat, a.q_pe], dim=-1)                    # [B, N, L + R]
    kwargs = {}
    cache = a.kv_cache
    if a.kv_cache_dtype in ("fp8", "fp8_e4m3"):
        if not kernel_takes("k_scale"):
            raise mlagate.NotSupported("this triton_decode_attention.py takes no k_scale: FP8 Triton MLA not supported")
        cache = cache.view(torch.float8_e4m3fn)                 # bytes [blocks, block_size, L + R] -> e4m3
        kwargs["k_scale"] = torch.tensor([a.k_scale], dtype=torch.float32, device=q.device)
    elif a.kv_cache_dtype != "auto":
        raise mlagate.NotSupported(f"kv cache dtype {a.kv_cache_dtype}")
    if kernel_takes("is_mla"):
        kwargs["is_mla"] = True
        splits = _num_kv_splits(B, int(a.seq_lens.max()))
    else:
        splits = 4                                              # TritonMLAImpl: 1 if batch invariant else 4
    k_buffer = cache.unsqueeze(2)                               # [blocks, block_size, 1, L + R]
    v_buffer = k_buffer[..., :L]
    attn_logits = torch.empty(B, N, splits, L + 1, dtype=torch.float32, device=q.device)
    decode_attention_fwd(q, k_buffer, v_buffer, a.o_lat, a.lse, a.block_table, a.seq_lens, attn_logits,
                         splits, a.scale, a.block_size, **kwargs)


def torch_prefill(a):
    """Ordinary attention over contiguous varlen K/V, bottom-right causal, with its lse (float32 math)."""
    cq, ck = a.cu_seqlens_q.tolist(), a.cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        q, k, v = a.q[cq[i]:cq[i + 1]].float(), a.k[ck[i]:ck[i + 1]].float(), a.v[ck[i]:ck[i + 1]].float()
        nq, nk = q.shape[0], k.shape[0]
        if nq == 0:
            continue
        logits = a.scale * torch.einsum("qnd,knd->nqk", q, k)
        if a.causal:
            last = nk - nq + torch.arange(nq, device=q.device)
            logits = logits.masked_fill(torch.arange(nk, device=q.device)[None, None, :] > last[None, :, None],
                                        float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)                   # [N, q]
        p = torch.exp(logits - lse[..., None]).nan_to_num(0.0)  # a row with no key: o = 0
        a.o[cq[i]:cq[i + 1]] = torch.einsum("nqk,knv->qnv", p, v).to(a.o.dtype)
        a.lse[cq[i]:cq[i + 1]] = lse.transpose(0, 1)


def supports(spec: dict, op: str):
    d = spec["kv_lora_rank"] + spec["rope_dim"]
    if d not in (576, 288):  # is_mla=True takes V as K's first L columns: the kernel's tiling knows 576 and 288
        return f"head size L+R={d}: TRITON_MLA's kernel compiles for 576 and 288 only"
    return None


def make_backend(fp8: bool):
    """TRITON_MLA as the loaded kernel declares it (fp8 caches where it takes k_scale)."""
    return mlagate.Backend(decode=triton_decode, prefill=torch_prefill, framework="torch", device="cuda",
                           block_sizes=(16, 32, 64), dtypes=("bf16", "fp16"),
                           kv_dtypes=("auto", "fp8", "fp8_e4m3") if fp8 else ("auto",),
                           query_len_support="single", supports=supports,
                           description="vLLM TRITON_MLA decode (triton_decode_attention.py) + torch prefill")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    ap.add_argument("--vllm", required=True, help="a vLLM checkout, or its triton_decode_attention.py")
    args, rest = ap.parse_known_args()
    global decode_attention_fwd
    decode_attention_fwd, path = load_kernel(args.vllm)
    os.environ["MLAGATE_VLLM"] = os.path.abspath(args.vllm)  # the workers load the same file
    fp8 = kernel_takes("k_scale")
    print(f"TRITON_MLA decode from {path} (fp8 caches: {'yes, k_scale' if fp8 else 'no'})", flush=True)
    return mlagate.run({"vllm.triton_mla": make_backend(fp8)}, argv=rest).exit_code


if __name__ == "__main__":
    sys.exit(main())
