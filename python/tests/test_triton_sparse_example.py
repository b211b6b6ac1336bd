"""python/examples/vllm_triton_mla_sparse.py (vLLM's TRITON_MLA_SPARSE kernel) where no GPU is needed: its
command line, its error and skip paths, and what it declares, through the harness, on the sparse and nope
suites. The kernel itself runs on the GPU machine only (scripts/gpu_check.sh python); here a stand-in
kernel file with the real one's constants (_DIM_QK 576, _MIN_BLOCK_N 16) takes its place, and any call
that reaches it is only counted; where torch imports, a torch stand-in that follows the kernel's interface
(bf16 out, indices < 0 or >= the rows masked wherever they sit) checks the example's glue on the CPU: the
views and arguments vLLM passes, the output handed back, the lse. Runs with PYTHONPATH=<build>/python
(ctest sets it)."""

import os
import subprocess
import sys
import types

import pytest

import mlagate

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
SCRIPT = os.path.join(EXAMPLES, "vllm_triton_mla_sparse.py")
sys.path.insert(0, EXAMPLES)
import vllm_triton_mla_sparse as ex  # noqa: E402

STAND_IN = '''"""A stand-in for vLLM's triton_sparse_mla_kernel.py: its constants, and a function that is not a kernel."""
_DIM_QK = 576
_MIN_BLOCK_N = 16


def triton_sparse_mla_attention(q, kv, indices, sm_scale, num_kv_splits=None, sm_count=None):
    raise NotImplementedError("a stand-in kernel (tests/test_triton_sparse_example.py)")
'''


def _checkout(tmp_path):
    """A checkout holding only the stand-in kernel file, where the example looks for it."""
    path = tmp_path / "vllm" / "v1" / "attention" / "ops" / "triton_sparse_mla_kernel.py"
    path.parent.mkdir(parents=True)
    path.write_text(STAND_IN)
    return path


def _script(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


def _gpu_present() -> bool:
    try:
        import torch  # noqa: PLC0415
        import triton  # noqa: F401, PLC0415
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_help_names_vllm():
    r = _script("--help")
    assert r.returncode == 0, r.stderr
    assert "--vllm" in r.stdout and "mlagate run's" in r.stdout


def test_a_path_without_the_kernel_file_is_an_error(tmp_path):
    r = _script("--vllm", str(tmp_path), "--suite", "sparse")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "no triton_sparse_mla_kernel.py under" in r.stderr
    assert os.path.join("vllm", "v1", "attention", "ops", "triton_sparse_mla_kernel.py") in r.stderr


def test_skips_without_torch_triton_or_cuda(tmp_path):
    if _gpu_present():
        pytest.skip("torch, Triton and a CUDA device are here: the example runs instead of skipping")
    for where in (tmp_path, _checkout(tmp_path)):  # a checkout, or the file itself
        r = _script("--vllm", str(where), "--suite", "sparse")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert r.stdout.startswith("vllm_triton_mla_sparse: skipped: "), r.stdout


def _why_not(spec):
    """What the example should answer for a case, from vLLM's declarations and the kernel's assert."""
    if spec["kv_cache_dtype"] != "auto":  # the harness's checks first (declared kv dtypes), then the op's
        return "kv cache dtype"
    if not spec["sparse"]:
        return "a dense case"
    if spec["kv_lora_rank"] + spec["rope_dim"] != 576:
        return "head_size not supported"
    if spec["sink"]:
        return "attention sinks not supported"
    if spec["topk"] % 16:
        return f"topk ({spec['topk']}) must be a multiple of the smallest autotune BLOCK_N (16)"
    return None


@pytest.mark.parametrize("suite", ["sparse", "nope"])
def test_declarations_through_the_harness(tmp_path, monkeypatch, suite):
    monkeypatch.setenv(ex.ENV, str(_checkout(tmp_path)))
    monkeypatch.setattr(ex, "kernel", None)
    specs = {c.id: c.spec for c in mlagate.cases(suite=suite)}
    r = mlagate.run({"vllm.triton_mla_sparse": ex.make_backend()}, suite=suite, op="sparse_decode", quiet=True,
                    isolate="none")
    assert len(r.records) == len(specs)
    reached = 0
    for x in r.records:
        why = _why_not(specs[x["id"]])
        if why is None:  # reached the (stand-in) kernel: an error record, not a refusal
            assert x["status"] != "NOT_SUPPORTED", (x["id"], x["message"])
            reached += 1
        else:
            assert x["status"] == "NOT_SUPPORTED" and why in x["message"], (x["id"], x["status"], x["message"])
    if suite == "nope":  # NoPE is head size 512: every record refused, none reaches the kernel
        assert reached == 0 and r.exit_code == 4
    else:
        assert reached > 0


def _torch_stand_in(calls):
    """triton_sparse_mla_attention's interface and masking in torch (float32 math, bf16 out), checking that
    it is called as TritonMLASparseImpl._forward_bf16_kv calls it."""
    import torch  # noqa: PLC0415

    def attention(q, kv, indices, sm_scale, num_kv_splits=None, sm_count=None):
        T, H, D = q.shape
        assert D == 576 and kv.dim() == 3 and kv.shape[1:] == (1, 576), kv.shape
        assert indices.dtype == torch.int32 and indices.shape[:2] == (T, 1) and indices.shape[2] % 16 == 0
        assert num_kv_splits is None and sm_count == 132  # vLLM passes the cached SM count, no split count
        calls.append(float(sm_scale))
        out = torch.zeros(T, H, 512, dtype=torch.bfloat16)
        for t in range(T):
            idx = indices[t, 0].long()
            idx = idx[(idx >= 0) & (idx < kv.shape[0])]
            if idx.numel():
                k = kv[idx, 0].float()
                out[t] = (torch.softmax(sm_scale * q[t].float() @ k.T, dim=-1) @ k[:, :512]).to(torch.bfloat16)
        return out

    return types.SimpleNamespace(_DIM_QK=576, _MIN_BLOCK_N=16, num_compute_units=lambda device_id=0: 132,
                                 triton_sparse_mla_attention=attention)


def test_glue_with_a_torch_stand_in_kernel(monkeypatch):
    pytest.importorskip("torch")
    calls = []
    monkeypatch.setattr(ex, "kernel", _torch_stand_in(calls))
    # The example's own functions on the CPU (its backend is device="cuda"): the same declarations.
    b = mlagate.Backend(sparse_decode=ex.triton_sparse_decode, supports=ex.supports, framework="torch", device="cpu",
                        block_sizes=ex.BLOCK_SIZES, dtypes=("bf16", "fp16"), kv_dtypes=("auto",))
    r = mlagate.run({"glue": b}, suite="sparse", op="sparse_decode", quiet=True, isolate="none")
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert ran and all(x["status"] == "PASSED" for x in ran), [(x["id"], x["status"], x["message"]) for x in ran]
    assert len(calls) == len(ran) and r.exit_code == 0
    # fp16: the kernel's output is bf16 whatever q's dtype, and the record says so.
    r = mlagate.run({"glue": b}, suite="sparse", op="sparse_decode", dtype="fp16", kv_cache_dtype="auto", quiet=True,
                    isolate="none", filter="topk=64")
    assert r.records and all(x["status"] == "INCORRECT" and "dtype bfloat16, expected float16" in x["message"]
                             for x in r.records), [(x["status"], x["message"]) for x in r.records]
