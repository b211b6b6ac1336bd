"""vLLM's Triton sparse MLA kernel (the TRITON_MLA_SPARSE backend's) under mlagate, from your vLLM checkout.

    PYTHONPATH=build/cuda/python python3 python/examples/vllm_triton_mla_sparse.py \\
        --vllm ~/src/vllm --suite sparse --op sparse_decode --junit triton_sparse.xml

--vllm: a vLLM checkout (or the kernel file itself, vllm/v1/attention/ops/triton_sparse_mla_kernel.py).
The kernel is loaded from that file alone: where vLLM is not importable (not built, as a bare checkout
is), its two imports (vllm.triton_utils.{LOG2E, LOGE2, tl, triton} and
vllm.utils.platform_utils.num_compute_units) are stood in for by the small modules below. Without
--vllm the kernel comes from an installed vLLM; with neither, or without torch, Triton or a CUDA
device, the example says "skipped: ..." and exits 0 (nothing to test); a --vllm path without the
kernel file is an error (exit 2). Nothing of vLLM is part of mlagate.

The backend is the sparse_decode op (DeepSeek V3.2's top-k rows; --op sparse_decode and --suite
sparse are the defaults) called as TritonMLASparseImpl._forward_bf16_kv calls the kernel:
triton_sparse_mla_attention(q [T, H, 576], the cache viewed as [-1, 1, 576] (page size 1: a global
slot is a row), the index rows viewed as [T, 1, topk] int32, sm_scale = the softmax scale,
sm_count = the device's SM count), output [T, H, 512] (its first H heads, as vLLM slices it). The
harness hands the rows already converted to global slots (vLLM's
triton_convert_req_index_to_global_index), -1 for no key, scattered through the row: the kernel
masks every index < 0 or >= the cache's slots wherever it sits, so the rows go as they are.

What it declares is what vLLM's TritonMLASparseBackend declares: dtypes fp16 and bf16
(supported_dtypes), kv cache auto only (supported_kv_cache_dtypes: auto, float16, bfloat16: the
model dtype), head size 576 only (get_supported_head_sizes: [_DIM_QK]), any compute capability,
any block size (vLLM forces 64 for sparse models: the preferred one here); no attention sinks
(AttentionBackend.supports_sink() is False and not overridden: "attention sinks not supported");
and what the kernel asserts: topk a multiple of _MIN_BLOCK_N (16), refused with the kernel's own
text. No topk_length (vLLM's call passes the index rows alone) and no V4 window or compressed cache.
vLLM's index conversion (sparse_utils.py's triton_convert_req_index_to_global_index) asserts
NUM_TOPK_TOKENS % 128 == 0 (its BLOCK_N); the harness converts the rows itself, so widths that are
multiples of 16 but not of 128 reach the kernel here (vLLM's index_topk is 2048).

Two things the kernel does that the records show as they are:
- its output is bfloat16 whatever q's dtype (`torch.empty(..., dtype=torch.bfloat16)`, stores
  `.to(tl.bfloat16)`): an fp16 case gets a bfloat16 o back, which the harness records as a wrong
  output dtype (INCORRECT: "dtype bfloat16, expected float16"); vLLM hands that tensor unchanged to
  _v_up_proj, whose torch.bmm with an fp16 W_UV does not take mixed dtypes (read, not run);
- it returns no lse (vLLM's forward_mqa returns (out, None)), and the module has no lse-optional
  path: the lse handed back is computed here in torch (fp32, over the same rows), so the lse
  metrics of these records are this example's, and only o tests the kernel.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
import types

import mlagate

KERNEL = os.path.join("vllm", "v1", "attention", "ops", "triton_sparse_mla_kernel.py")
MODULE = "vllm.v1.attention.ops.triton_sparse_mla_kernel"
ENV = "MLAGATE_VLLM_SPARSE"  # the file the main process loaded, for the isolation workers

# vLLM forces the kv cache block size to 64 for sparse MLA (its platform's check_and_update_config);
# the kernel reads global slots, so every power of two the harness builds works.
BLOCK_SIZES = (64, 1, 2, 4, 8, 16, 32, 128, 256, 512, 1024)

kernel = None  # the loaded module (set by main(), again in each isolation worker: see _ensure_kernel)


def _stand_in_vllm() -> None:
    """Stand-ins for the two vLLM modules the kernel file imports, where vLLM does not provide them.
    Without Triton nothing is stood in for: the kernel file's own import then says what is missing."""
    try:
        from vllm.triton_utils import LOG2E, LOGE2, tl, triton  # noqa: F401, PLC0415
        from vllm.utils.platform_utils import num_compute_units  # noqa: F401, PLC0415
        return
    except Exception:  # noqa: BLE001 - a bare checkout (or another vLLM version) is not importable
        pass
    try:
        import torch  # noqa: PLC0415
        import triton  # noqa: PLC0415
    except ImportError:
        return
    vllm = sys.modules.get("vllm") or types.ModuleType("vllm")
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.triton, triton_utils.tl = triton, triton.language
    triton_utils.HAS_TRITON = True
    triton_utils.LOG2E, triton_utils.LOGE2 = 1.4426950408889634, 0.6931471805599453  # vllm/triton_utils' values
    utils = sys.modules.get("vllm.utils") or types.ModuleType("vllm.utils")
    platform_utils = types.ModuleType("vllm.utils.platform_utils")
    # vLLM's CUDA platform answers with the device's multiprocessor count.
    platform_utils.num_compute_units = lambda device_id=0: torch.cuda.get_device_properties(
        device_id or 0).multi_processor_count
    vllm.triton_utils, utils.platform_utils = triton_utils, platform_utils
    if not hasattr(vllm, "utils"):
        vllm.utils = utils
    sys.modules.update({"vllm": vllm, "vllm.triton_utils": triton_utils, "vllm.utils": utils,
                        "vllm.utils.platform_utils": platform_utils})


def find_kernel_file(where: str) -> tuple[str | None, str]:
    """(the kernel file under a checkout, or the file itself; None and why not)."""
    candidates = [where] if where.endswith(".py") else [os.path.join(where, KERNEL)]
    path = next((p for p in candidates if os.path.isfile(p)), None)
    if path is None:
        return None, f"no triton_sparse_mla_kernel.py under {where} (tried {', '.join(candidates)})"
    return path, path


def load_kernel(path: str | None):
    """The kernel module, from that file alone, or from an installed vLLM (path None)."""
    if path is None:
        return importlib.import_module(MODULE)
    _stand_in_vllm()
    spec = importlib.util.spec_from_file_location("vllm_triton_sparse_mla_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "triton_sparse_mla_attention", None)):
        raise ImportError(f"{path} has no triton_sparse_mla_attention")
    return module


def _ensure_kernel():
    global kernel
    if kernel is None:
        kernel = load_kernel(os.environ.get(ENV) or None)
    return kernel


def _dims() -> tuple[int, int]:
    """The loaded kernel's head size and top-k divisor (its _DIM_QK and _MIN_BLOCK_N; vLLM's backend
    declares its head sizes as [_DIM_QK] from the same file)."""
    k = _ensure_kernel()
    return int(getattr(k, "_DIM_QK", 576)), int(getattr(k, "_MIN_BLOCK_N", 16))


def supports(spec: dict, op: str):
    # After the harness's own checks (dtypes, kv dtype auto, block sizes, a sparse case for the op).
    dim_qk, min_block_n = _dims()
    if spec["window"] or spec["compress"]:
        return ("V3.2 top-k rows only: TRITON_MLA_SPARSE's forward_mqa reads one index row per token "
                "into one cache (no V4 window or compressed cache)")
    d = spec["kv_lora_rank"] + spec["rope_dim"]
    if d != dim_qk:
        return (f"head_size not supported (TRITON_MLA_SPARSE: get_supported_head_sizes() = [{dim_qk}]; "
                f"the case has L+R = {d})")
    if spec["kv_lora_rank"] != 512:  # the kernel's value is the first _BLOCK_DV = 512 columns of a row
        return f"kv_lora_rank {spec['kv_lora_rank']}: the kernel's value is the first 512 columns of each row"
    if spec["sink"]:
        return "attention sinks not supported (TRITON_MLA_SPARSE does not override supports_sink)"
    topk = spec["topk"]
    if topk % min_block_n:  # the kernel's assert, in its words
        return f"topk ({topk}) must be a multiple of the smallest autotune BLOCK_N ({min_block_n})"
    return None


def _lse(q, kv, indices, scale: float):
    """The rows' lse in torch (float32, natural log), over the keys the kernel reads: every index in
    [0, slots), duplicates counted; a row with none gives -inf. The kernel itself returns none."""
    import torch  # noqa: PLC0415

    T, H, _ = q.shape
    slots = kv.shape[0]
    out = torch.empty(T, H, dtype=torch.float32, device=q.device)
    step = max(1, (1 << 27) // max(1, indices.shape[1] * kv.shape[-1]))  # about 512 MiB of float32 keys a chunk
    for t0 in range(0, T, step):
        idx = indices[t0:t0 + step].long()
        valid = (idx >= 0) & (idx < slots)
        keys = kv[idx.clamp(0, max(slots - 1, 0))].float()               # [t, K, D]
        logits = scale * torch.einsum("thd,tkd->thk", q[t0:t0 + step].float(), keys)
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        out[t0:t0 + step] = torch.logsumexp(logits, dim=-1)               # all -inf: -inf, not NaN
    return out


def triton_sparse_decode(a):
    import torch  # noqa: PLC0415

    k = _ensure_kernel()
    if a.indices is None or a.window:
        raise mlagate.NotSupported("V3.2 top-k rows only (no V4 window)")
    if a.topk_length is not None:
        raise mlagate.NotSupported("no topk_length: vLLM's forward_mqa passes the converted index rows alone "
                                   "(-1 for no key)")
    if a.sink is not None:
        raise mlagate.NotSupported("attention sinks not supported")
    T, H, D = a.q.shape
    if T == 0:
        return None
    # TritonMLASparseImpl._forward_bf16_kv, as it is: the cache viewed as rows of page size 1, the index
    # rows as [T, 1, topk], the SM count vLLM caches at init (num_compute_units of the device).
    kv = a.kv_cache.view(-1, 1, a.kv_cache.shape[-1])
    indices = a.indices.view(T, 1, -1)
    ncu = getattr(k, "num_compute_units", None)
    if callable(ncu):
        sm_count = ncu(a.q.device.index)
    else:
        sm_count = torch.cuda.get_device_properties(a.q.device).multi_processor_count
    out = k.triton_sparse_mla_attention(a.q, kv, indices, sm_scale=a.scale, sm_count=sm_count)
    out = out[:, :H, :]
    return {"o": out, "lse": _lse(a.q, kv.view(kv.shape[0], -1), a.indices, a.scale)}


def make_backend():
    """TRITON_MLA_SPARSE as vLLM's TritonMLASparseBackend declares it (module docstring)."""
    return mlagate.Backend(sparse_decode=triton_sparse_decode, framework="torch", device="cuda",
                           block_sizes=BLOCK_SIZES, dtypes=("bf16", "fp16"), kv_dtypes=("auto",),
                           query_len_support="varlen", supports=supports,
                           description="vLLM TRITON_MLA_SPARSE sparse decode (triton_sparse_mla_kernel.py); "
                                       "lse computed in torch (the kernel returns none)")


def _why_no_gpu() -> str | None:
    """Why the kernel cannot run here (torch, Triton, a CUDA device), or None."""
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        return f"torch is not importable ({e})"
    try:
        import triton  # noqa: F401, PLC0415
    except ImportError as e:
        return f"Triton is not importable ({e})"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True,
                                 epilog="Every other flag is mlagate run's (--suite, --op, --policy, --junit, ...).")
    ap.add_argument("--vllm", default=None, help="a vLLM checkout, or its triton_sparse_mla_kernel.py "
                                                 "(default: import vLLM)")
    args, rest = ap.parse_known_args()
    path = None
    if args.vllm:  # a path given and wrong: an error, not a skip
        path, why = find_kernel_file(args.vllm)
        if path is None:
            print(f"vllm_triton_mla_sparse: error: {why}", file=sys.stderr, flush=True)
            return 2
    why = _why_no_gpu()
    if why:
        print(f"vllm_triton_mla_sparse: skipped: {why}; the kernel needs torch, Triton and a CUDA device", flush=True)
        return 0
    global kernel
    try:
        kernel = load_kernel(path)
    except Exception as e:  # noqa: BLE001 - not installed, or a file that does not load
        if path:
            print(f"vllm_triton_mla_sparse: error: loading {path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 2
        print(f"vllm_triton_mla_sparse: skipped: vLLM is not importable ({MODULE}: {type(e).__name__}: {e}); "
              "give --vllm CHECKOUT to load the file alone", flush=True)
        return 0
    if path:
        os.environ[ENV] = os.path.abspath(path)  # the workers load the same file
    where = path or MODULE
    params = ", ".join(inspect.signature(kernel.triton_sparse_mla_attention).parameters)
    print(f"TRITON_MLA_SPARSE kernel from {where} (triton_sparse_mla_attention({params}))", flush=True)
    if not any(f == "--suite" or f.startswith("--suite=") for f in rest):
        rest = ["--suite", "sparse"] + rest
    if not any(f == "--op" or f.startswith("--op=") for f in rest):
        rest = rest + ["--op", "sparse_decode"]
    return mlagate.run({"vllm.triton_mla_sparse": make_backend()}, argv=rest).exit_code


if __name__ == "__main__":
    sys.exit(main())
