"""The sparse ops through Python: a numpy sparse prefill (python/examples/numpy_sparse.py) passes the
sparse (V3.2) and v4 cases, and a planted sparse bug in it (every slot read, past topk_length) is caught.
Runs with PYTHONPATH=<build>/python (ctest sets it)."""

import os
import sys

import mlagate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import numpy_sparse  # noqa: E402


def _run(**kw):
    return mlagate.run({"numpy.sparse": numpy_sparse.BACKEND}, op="sparse_prefill", quiet=True, isolate="none", **kw)


def test_numpy_sparse_prefill_passes_v32_and_v4_cases():
    for suite, filt in (("sparse", "idx=lens|idx=invalid_rows|idx=oob|sink"), ("v4", "v4_decode|v4_mixed")):
        r = _run(suite=suite, filter=filt)
        ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
        assert ran and all(x["status"] == "PASSED" for x in ran), [(x.get("case"), x["status"]) for x in ran]
        assert r.exit_code == 0


def test_planted_sparse_bug_is_caught_through_python(monkeypatch):
    monkeypatch.setattr(numpy_sparse, "PLANT", "topk_length")
    r = _run(suite="sparse", filter="idx=lens")
    assert r.records and r.exit_code == 1
    # The slots past a row's length name poisoned rows: read, they make the output wrong or NaN.
    assert all(x["status"] in ("INCORRECT", "NONFINITE") for x in r.records), [x["status"] for x in r.records]
    monkeypatch.setattr(numpy_sparse, "PLANT", "")
    assert _run(suite="sparse", filter="idx=lens").exit_code == 0
