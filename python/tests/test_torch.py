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


# ------------------------------------------------------------------ --cuda-graph on the GPU

def graph_decode(a, seq_lens=None):
    """A capturable torch decode for uniform batches: fixed shapes, no host sync (no .tolist()),
    outputs written in place; seq_lens from the args unless a schedule is given."""
    seq = a.seq_lens if seq_lens is None else seq_lens
    B, T = a.block_table.shape[0], a.q_lat.shape[0]
    q_len, L, bs = T // B, a.q_lat.shape[-1], a.block_size
    q = torch.cat([a.q_lat, a.q_pe], dim=-1).float().reshape(B, q_len, a.q_lat.shape[1], -1)  # [B, q, N, D]
    S = a.block_table.shape[1] * bs
    pos = torch.arange(S, device=q.device)
    slots = a.block_table[:, pos // bs].long().clamp(min=0) * bs + pos % bs                     # [B, S]
    kv = a.kv_cache.reshape(-1, a.kv_cache.shape[-1])[slots].float()                            # [B, S, D]
    # rows past a request's keys hold the harness's poison (NaN): zero them, as 0 x NaN = NaN
    kv = torch.where((pos[None, :] < seq[:, None])[..., None], kv, 0.0)
    logits = a.scale * torch.einsum("bqnd,bsd->bqns", q, kv)
    last = seq[:, None].long() - q_len + torch.arange(q_len, device=q.device)[None, :]         # [B, q]
    logits = logits.masked_fill(pos[None, None, None, :] > last[:, :, None, None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)                                                       # [B, q, N]
    p = torch.where(torch.isfinite(lse)[..., None], torch.exp(logits - lse[..., None]), 0.0)
    o = torch.einsum("bqns,bsl->bqnl", p, kv[..., :L])
    a.o_lat.copy_(o.reshape(T, *a.o_lat.shape[1:]).to(a.o_lat.dtype))
    a.lse.copy_(lse.reshape(T, -1))


_STALE = {}


def stale_prepare(a):
    _STALE["seq"] = a.seq_lens.clone()  # vLLM #35175's class: a fresh metadata tensor per call


def stale_decode(a):
    graph_decode(a, _STALE["seq"])


def graph_backend(decode, prepare=None):
    return mlagate.Backend(decode=decode, prepare=prepare, cuda_graph=True, framework="torch", device="cuda",
                           block_sizes=(16, 64), query_len_support="uniform")


@cuda
def test_torch_cuda_graphs_replay_and_stale_metadata_is_caught():
    flags = ["--cuda-graph", "--capture-sizes", "8,64,512"]
    r = mlagate.run({"torch.graph": graph_backend(graph_decode)}, suite="gate", op="decode", filter="kv=auto",
                    quiet=True, argv=flags)
    passed = [x for x in r.records if x["status"] == "PASSED"]
    assert passed and all(x["status"] in ("PASSED", "NOT_SUPPORTED") for x in r.records), r.failures()
    assert any("replayed, captured at" in x["message"] for x in passed)
    plain = mlagate.run({"torch.stale": graph_backend(stale_decode, stale_prepare)}, suite="gate", op="decode",
                        filter="kv=auto", quiet=True)
    assert plain.exit_code == 0, plain.failures()
    stale = mlagate.run({"torch.stale": graph_backend(stale_decode, stale_prepare)}, suite="gate", op="decode",
                        filter="kv=auto", quiet=True, argv=flags)
    caught = [x for x in stale.records if x["status"] in ("INCORRECT", "NONFINITE")]
    print(f"torch graphs: {len(passed)} passed; stale metadata: {len(caught)} caught under replay")
    assert stale.exit_code == 1 and caught
