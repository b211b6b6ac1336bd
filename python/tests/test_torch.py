"""The module with torch: zero-copy DLPack into torch, a torch backend on the CPU, and on the GPU
(device='cuda') where there is one. Skipped (visibly) where torch or a GPU is missing."""

import os
import sys

import pytest

import mlagate

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import torch_mla  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def test_torch_from_dlpack_is_zero_copy():
    case = mlagate.cases(suite="smoke", filter="kv=auto")[0]
    a = case.inputs("decode")
    t = torch.from_dlpack(a.q_lat)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == a.q_lat.shape
    assert t.data_ptr() == a.q_lat.__array_interface__["data"][0]
    case.release()


def test_torch_backend_on_the_cpu_passes():
    r = mlagate.run({"torch.cpu": torch_mla.backend("cpu")}, suite="smoke", op="decode", filter="kv=auto",
                    quiet=True)
    assert r.exit_code == 0 and r.records, r.failures()


@cuda
def test_torch_backend_on_the_gpu_passes_and_a_planted_bug_is_caught():
    r = mlagate.run({"torch.cuda": torch_mla.backend("cuda")}, suite="smoke", op="decode", filter="kv=auto",
                    quiet=True)
    assert r.exit_code == 0 and r.records, r.failures()
    case = mlagate.cases(suite="smoke", filter="kv=auto")[0]
    a = case.inputs("decode", framework="torch", device="cuda")
    assert a.q_lat.is_cuda
    torch_mla.decode(a)
    assert case.check(a), case.check(a)
    a.o_lat[0, 0, 0] += 1.0  # one element
    r = case.check(a)
    assert r.status == "INCORRECT" and r.metrics["o_lat"]["worst"]["dim"] == 0
    case.release()
