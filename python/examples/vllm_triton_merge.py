"""vLLM's Triton merge_attn_states (chunked prefill's, cascade attention's and DCP's LSE merge) under mlagate.

    PYTHONPATH=build/cuda/python python3 python/examples/vllm_triton_merge.py --suite merge --junit merge.xml
    PYTHONPATH=build/cuda/python python3 python/examples/vllm_triton_merge.py --vllm ~/src/vllm --suite merge

The kernel comes from an importable vLLM (vllm.attention.ops.triton_merge_attn_states, or the v1 path
vllm.v1.attention.ops.triton_merge_attn_states), or with --vllm from a checkout (or the kernel file
itself), loaded from that file alone: where vLLM is not importable its vllm.triton_utils import is
stood in for by a small module below. Without vLLM and without --vllm the example says so and exits
0 (nothing to test); a --vllm path without the kernel file is an error (exit 2). Nothing of vLLM is
part of mlagate.

The backend calls the kernel as vLLM's MLA prefill does: output, prefix_output, suffix_output
[T, N, D] contiguous on the GPU; vLLM's lse layout is [N, T] (FlashAttention's), mlagate's [T, N],
so the lses are transposed on the way in and out. Every other flag is mlagate run's (--suite merge,
--suite gate --op merge_states, --policy, --junit ...). What to expect: rows empty on both sides
(lse -inf or +inf on both) are where kernels of this form have given NaN (-inf - -inf); the merge
suite's both_empty, both_pinf and mixed cases say whether the loaded kernel does.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import types

import mlagate

MODULES = ("vllm.attention.ops.triton_merge_attn_states", "vllm.v1.attention.ops.triton_merge_attn_states")

merge_attn_states = None  # set by _ensure_kernel() (again in each isolation worker)


def _stand_in_vllm() -> None:
    """A stand-in for vllm.triton_utils (the one vLLM module the kernel file may import)."""
    try:
        import vllm.triton_utils  # noqa: F401, PLC0415
        return
    except Exception:  # noqa: BLE001 - a bare checkout is not importable
        pass
    import triton  # noqa: PLC0415
    vllm = sys.modules.get("vllm") or types.ModuleType("vllm")
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.triton, triton_utils.tl = triton, triton.language
    # What the kernel file's versions import from it: HAS_TRITON and, in some,
    # the decorator its kernel is jitted with.
    triton_utils.HAS_TRITON = True
    triton_utils.triton_jit_decorator = triton.jit
    vllm.triton_utils = triton_utils
    sys.modules.update({"vllm": vllm, "vllm.triton_utils": triton_utils})


def load_kernel(where: str | None):
    """(merge_attn_states, where it came from), or (None, why not)."""
    if where:
        candidates = [where] if where.endswith(".py") else [
            os.path.join(where, *m.split(".")) + ".py" for m in MODULES]
        path = next((p for p in candidates if os.path.isfile(p)), None)
        if path is None:
            return None, f"no triton_merge_attn_states.py under {where} (tried {', '.join(candidates)})"
        _stand_in_vllm()
        spec = importlib.util.spec_from_file_location("vllm_triton_merge_attn_states", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.merge_attn_states, path
    errors = []
    for name in MODULES:
        try:
            return importlib.import_module(name).merge_attn_states, name
        except Exception as e:  # noqa: BLE001 - not installed, or installed without its GPU build
            errors.append(f"{name}: {type(e).__name__}: {e}")
    return None, "vLLM is not importable (" + "; ".join(errors) + "); give --vllm CHECKOUT to load the file alone"


def _ensure_kernel() -> None:
    global merge_attn_states
    if merge_attn_states is None:
        merge_attn_states, where = load_kernel(os.environ.get("MLAGATE_VLLM_MERGE") or None)
        if merge_attn_states is None:
            raise RuntimeError(where)


def triton_merge(a):
    import torch  # noqa: PLC0415

    _ensure_kernel()
    # vLLM's lse is [N, T]: transposed copies in, the kernel's [N, T] out copied back as [T, N].
    prefix_lse = a.prefix_lse.transpose(0, 1).contiguous()
    suffix_lse = a.suffix_lse.transpose(0, 1).contiguous()
    output_lse = torch.empty_like(prefix_lse)
    merge_attn_states(a.output, a.prefix_output, prefix_lse, a.suffix_output, suffix_lse, output_lse)
    a.output_lse.copy_(output_lse.transpose(0, 1))


def make_backend():
    return mlagate.Backend(merge_states=triton_merge, framework="torch", device="cuda",
                           dtypes=("bf16", "fp16", "fp32"),
                           description="vLLM Triton merge_attn_states (triton_merge_attn_states.py)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    ap.add_argument("--vllm", default=None, help="a vLLM checkout, or its triton_merge_attn_states.py "
                                                 "(default: import vLLM)")
    args, rest = ap.parse_known_args()
    global merge_attn_states
    merge_attn_states, where = load_kernel(args.vllm)
    if merge_attn_states is None:
        if args.vllm:  # a path given and wrong: an error, not a skip
            print(f"vllm_triton_merge: error: {where}", file=sys.stderr, flush=True)
            return 2
        print(f"vllm_triton_merge: skipped: {where}", flush=True)
        return 0
    if args.vllm:
        os.environ["MLAGATE_VLLM_MERGE"] = os.path.abspath(args.vllm)  # the workers load the same file
    print(f"vLLM Triton merge_attn_states from {where}", flush=True)
    if not any(f == "--suite" or f.startswith("--suite=") for f in rest):
        rest = ["--suite", "merge"] + rest
    return mlagate.run({"vllm.triton_merge": make_backend()}, argv=rest).exit_code


if __name__ == "__main__":
    sys.exit(main())
