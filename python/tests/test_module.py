"""The Python module against the CLI it wraps: the same cases, the same verdicts, planted bugs caught,
bad input refused with a Python exception. Runs with PYTHONPATH=<build>/python (ctest sets it) and
MLAGATE_BIN=<build>/harness/mlagate."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mlagate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import numpy_mla  # noqa: E402

BIN = os.environ.get("MLAGATE_BIN", "mlagate")
SMOKE_DECODE = dict(suite="smoke", filter="kv=auto")


def cli(*args, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    if check and p.returncode not in (0, 1):
        raise AssertionError(p.stdout + p.stderr)
    return p


# ------------------------------------------------------------------ cases and tensors

def test_cases_are_the_clis_selection():
    ids = [c.id for c in mlagate.cases(suite="vllm")]
    listed = cli("list", "cases", "--suite", "vllm").stdout.split()
    assert ids and ids == [w for w in listed if w.startswith("vllm/")]
    narrowed = mlagate.cases(suite="vllm", kv_cache_dtype="fp8", tp=[8])
    assert narrowed and all("kv=fp8" in c.id and "/tp8/" in c.id for c in narrowed)


def test_inputs_are_zero_copy_dlpack_tensors():
    case = mlagate.cases(**SMOKE_DECODE)[0]
    a = case.inputs("decode")
    s = case.spec
    T, N, L, R = sum(s["query_lens"]), s["num_heads"], s["kv_lora_rank"], s["rope_dim"]
    assert a.q_lat.shape == (T, N, L) and a.q_pe.shape == (T, N, R) and a.lse.shape == (T, N)
    assert a.q_lat.dtype == "bfloat16" and a.o_lat.is_output
    x = np.from_dlpack(a.seq_lens)
    y = np.asarray(a.seq_lens)  # __array_interface__
    assert x.__array_interface__["data"][0] == y.__array_interface__["data"][0]  # the same bytes
    assert list(x) == s["seq_lens"]
    assert np.isnan(mlagate.to_numpy(a.o_lat)).all()  # outputs come poisoned
    # bf16 through numpy: the bits, and float32 by to_numpy
    bits = np.asarray(a.q_lat)
    assert bits.dtype == np.uint16
    assert np.array_equal(mlagate.to_numpy(a.q_lat).view(np.uint32) >> 16, bits.astype(np.uint32))
    case.release()


def test_numpy_reference_passes_and_matches_the_clis_record():
    case = mlagate.cases(**SMOKE_DECODE)[0]
    a = case.inputs("decode", framework="numpy")
    r = case.check(numpy_mla.decode(a))
    assert r.passed, r
    # The same case through the CLI's cpu.ref: both verdicts against the same reference and err_baseline.
    rep = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"mlagate-py-{os.getpid()}.json")
    cli("run", "--suite", "smoke", "--filter", "^" + case.id.replace("|", "\\|") + "$", "--backend", "cpu.paged",
        "--op", "decode", "--json", rep, "-q")
    with open(rep) as f:
        rec = json.load(f)["records"][0]
    os.unlink(rep)
    ours = {m["output"]: m for m in r.record["metrics"]}
    for m in rec["metrics"]:
        assert ours[m["output"]]["err_baseline"] == m["err_baseline"]
        assert ours[m["output"]]["numel"] == m["numel"]
    assert r.record["policy"] == rec["policy"]


def test_planted_bugs_are_caught():
    case = mlagate.cases(**SMOKE_DECODE)[0]
    a = case.inputs("decode", framework="numpy")
    good = numpy_mla.decode(a)
    wrong = dict(good, o_lat=good["o_lat"] * 1.01)  # a 1% scale error
    r = case.check(wrong)
    assert r.status == "INCORRECT" and "o_lat" in r.message
    nan = dict(good, lse=good["lse"].copy())
    nan["lse"][0, 0] = np.nan
    assert case.check(nan).status == "NONFINITE"
    one_row = dict(good, o_lat=good["o_lat"].copy())
    one_row["o_lat"][-1, -1, :] += 0.5  # one head of one token
    r = case.check(one_row)
    assert r.status == "INCORRECT" and r.metrics["o_lat"]["worst"]["head"] == case.spec["num_heads"] - 1
    assert case.check(good).passed  # and the good outputs still pass afterwards
    case.release()


def test_bad_input_is_a_python_exception():
    case = mlagate.cases(**SMOKE_DECODE)[0]
    a = case.inputs("decode", framework="numpy")
    good = numpy_mla.decode(a)
    with pytest.raises(ValueError, match=r"shape \[.*\], expected"):
        case.check(dict(good, lse=good["lse"][:-1]))
    with pytest.raises(TypeError, match="dtype int32"):
        case.check(dict(good, lse=good["lse"].astype(np.int32)))
    with pytest.raises(KeyError, match="no 'lse'"):
        case.check({"o_lat": good["o_lat"]})
    with pytest.raises(KeyError, match="unknown output 'o'"):
        case.check(dict(good, o=good["o_lat"]))
    with pytest.raises(ValueError, match="expected 2"):
        case.check((good["o_lat"],))
    with pytest.raises(TypeError, match="expected a tensor"):
        case.check({"o_lat": object(), "lse": good["lse"]})
    with pytest.raises(mlagate.InputError, match="layer"):
        case.inputs("layer")
    with pytest.raises(mlagate.InputError):
        mlagate.cases(suite="no-such-suite")
    with pytest.raises(mlagate.InputError):
        mlagate.cases(suite="smoke", policy="bogus")
    with pytest.raises(ValueError, match="sparse"):  # an op the case does not have
        case.inputs("sparse_decode")
    case.release()


# ------------------------------------------------------------------ run

def test_run_with_a_numpy_backend_passes_and_reports(tmp_path):
    report = tmp_path / "r.json"
    r = mlagate.run({"numpy.mla": numpy_mla.BACKEND}, suite="smoke", op="decode", quiet=True,
                    argv=["--json", str(report)])  # a report asked for among the raw flags is the one read
    assert json.loads(report.read_text())["records"] == r.records
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert r.exit_code == 0 and ran and all(x["status"] == "PASSED" for x in ran), r.failures()
    # a block size it does not declare: the CLI's own reason
    assert any(x["message"] == "block size 32 not in {16, 64}" for x in r.records if x["status"] == "NOT_SUPPORTED")


def scaled_decode(a):
    out = numpy_mla.decode(a)
    out["o_lat"] = out["o_lat"] * 1.02
    return out


def raising_decode(a):
    raise RuntimeError("kernel exploded")


def aborting_decode(a):
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file: a test, not a post-mortem
    os.abort()


def test_run_catches_a_planted_bug_and_exits_1(tmp_path):
    junit = tmp_path / "out.xml"
    r = mlagate.run({"buggy": mlagate.Backend(decode=scaled_decode, framework="numpy")},
                    suite="smoke", op="decode", filter="kv=auto", junit=str(junit), quiet=True, isolate="none")
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert r.exit_code == 1
    assert ran and all(x["status"] == "INCORRECT" for x in ran)
    assert "buggy" in junit.read_text()
    # The repro line reruns exactly that record, with the same Python function, from a shell.
    failing = ran[0]
    assert "--backend buggy" in failing["repro"] and "_worker.py" in failing["repro"]
    p = subprocess.run(failing["repro"] + " --json " + str(tmp_path / "again.json"), shell=True,
                       capture_output=True, text=True, cwd="/")
    assert p.returncode == 1, p.stdout + p.stderr
    again = json.loads((tmp_path / "again.json").read_text())["records"]
    assert [(x["id"], x["status"], x["message"]) for x in again] == \
        [(failing["id"], failing["status"], failing["message"])]


def test_a_raising_function_is_a_record_and_an_abort_is_isolated():
    r = mlagate.run({"raises": mlagate.Backend(decode=raising_decode, framework="numpy"),
                     "aborts": mlagate.Backend(decode=aborting_decode, framework="numpy"),
                     "good": numpy_mla.BACKEND},  # two cases: every worker start imports libtorch
                    suite="smoke", op="decode", filter="small_decode|small_prefill", quiet=True, isolate="process")
    by = {}
    for x in (x for x in r.records if x["status"] != "NOT_SUPPORTED"):
        by.setdefault(x["backend"], []).append(x)
    assert all(x["status"] == "CRASHED" and "RuntimeError: kernel exploded" in x["message"]
               and "test_module.py" in x["message"] for x in by["raises"])
    assert all(x["status"] == "CRASHED" for x in by["aborts"])  # the worker died, the run went on
    assert all(x["status"] == "PASSED" for x in by["good"])
    assert r.exit_code == 1


def test_run_refuses_what_the_cli_refuses():
    with pytest.raises(ValueError, match="isolate='process'"):
        mlagate.run({"lam": lambda a: None}, suite="smoke", isolate="process")
    assert mlagate.run({"x": numpy_mla.BACKEND}, suite="no-such-suite", quiet=True).exit_code == 2
    with pytest.raises(mlagate.InputError, match="query_len_support"):
        mlagate.run({"x": mlagate.Backend(decode=numpy_mla.decode, query_len_support="sometimes")}, suite="smoke")


def wrong_shape_decode(a):
    return {"o_lat": np.zeros((1, 2, 3)), "lse": np.zeros(a.lse.shape)}


def test_wrong_returned_outputs_are_incorrect_records():
    r = mlagate.run({"shape": mlagate.Backend(decode=wrong_shape_decode, framework="numpy")},
                    suite="smoke", op="decode", filter="kv=auto", quiet=True, isolate="none")
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert ran and all(x["status"] == "INCORRECT" and "shape [1, 2, 3]" in x["message"] for x in ran)


def test_the_layer_op_composes_python_decode_and_prefill():
    # A Python decode (numpy) with the CPU's prefill is not possible in one backend; a Python backend
    # with only decode is NOT_SUPPORTED for layer cases that need prefill, with the CLI's reason.
    r = mlagate.run({"numpy.mla": numpy_mla.BACKEND}, suite="smoke", op="layer", quiet=True,
                    argv=["--allow-nothing-ran"])
    assert r.records
    statuses = {x["status"] for x in r.records}
    assert statuses <= {"PASSED", "NOT_SUPPORTED"}, r.failures()
    assert "PASSED" in statuses  # decode-only cases run through the layer glue


# ------------------------------------------------------------------ pytest plugin

def test_pytest_plugin_parametrizes_by_case_and_k_selects_one(tmp_path):
    t = tmp_path / "test_kernel.py"
    t.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.join(HERE, '..', 'examples')!r})\n"
        "import numpy_mla\n"
        "def test_decode(mlagate_case):\n"
        "    a = mlagate_case.inputs('decode', framework='numpy')\n"
        "    r = mlagate_case.check(numpy_mla.decode(a))\n"
        "    assert r, r.message\n")
    base = [sys.executable, "-m", "pytest", "-p", "mlagate.pytest_plugin", "--mlagate-suite", "smoke",
            "--mlagate-filter", "kv=auto", str(t), "-q", "-p", "no:cacheprovider"]
    p = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path)
    n = len(mlagate.cases(suite="smoke", filter="kv=auto"))
    assert p.returncode == 0 and f"{n} passed" in p.stdout, p.stdout + p.stderr
    one = mlagate.cases(suite="smoke", filter="kv=auto")[-1].id
    from mlagate.pytest_plugin import test_id
    p = subprocess.run(base + ["-k", test_id(one)], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr


def test_pytest_plugin_marks_expected_failures_xfail_and_a_strict_pass_fails(tmp_path):
    # A kernel that fails on fp8 caches (not fp8_e4m3), known by an expectations file: xfail, the
    # run green; an entry that also selects the fp8_e4m3 cases (which pass) is XPASS, a failure under strict.
    t = tmp_path / "test_kernel.py"
    t.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.join(HERE, '..', 'examples')!r})\n"
        "import numpy_mla\n"
        "def test_decode(mlagate_case):\n"
        "    a = mlagate_case.inputs('decode', framework='numpy')\n"
        "    out = numpy_mla.decode(a)\n"
        "    if mlagate_case.spec['kv_cache_dtype'] == 'fp8':\n"
        "        out['o_lat'] = out['o_lat'] * 1.5\n"
        "    r = mlagate_case.check(out)\n"
        "    assert r, r.message\n")
    def expect(where, strict):
        f = tmp_path / "e.yaml"
        f.write_text("schema: mlagate.expect/1\nexpect:\n  - id: k\n    backend: mine\n    op: decode\n"
                     f"    where: {where}\n    reason: scaled fp8 output\n    strict: {strict}\n")
        return str(f)
    only = "small_decode/tp16/bf16/kv=fp8(_e4m3)?/"  # the caches numpy_mla reads
    base = [sys.executable, "-m", "pytest", "-p", "mlagate.pytest_plugin", "--mlagate-suite", "fp8", "--mlagate-filter",
            only, str(t), "-q", "-p", "no:cacheprovider", "--mlagate-backend", "mine", "-rxX"]
    n_fp8 = len([c for c in mlagate.cases(suite="fp8", filter=only) if c.spec["kv_cache_dtype"] == "fp8"])
    assert n_fp8 > 0
    p = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1, p.stdout  # unexpected failures without the file
    p = subprocess.run(base + ["--mlagate-expect", expect("{kv: fp8}", "true")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and f"{n_fp8} xfailed" in p.stdout and "k: scaled fp8 output" in p.stdout, p.stdout + p.stderr
    p = subprocess.run(base + ["--mlagate-expect", expect("{kv: [fp8, fp8_e4m3]}", "true")], capture_output=True, text=True,
                       cwd=tmp_path)
    assert p.returncode == 1 and "XPASS(strict)" in p.stdout, p.stdout + p.stderr


# ------------------------------------------------------------------ repeat, poison

def noisy_decode(a):
    out = numpy_mla.decode(a)
    out["o_lat"] = out["o_lat"] + np.random.default_rng().normal(0, 1e-3, out["o_lat"].shape)
    return out


def forgetful_decode(a):
    """Writes every output element in place but the last token's last head: the poison shows."""
    out = numpy_mla.decode(a)
    a.o_lat[:-1] = out["o_lat"][:-1]
    a.o_lat[-1, :-1] = out["o_lat"][-1, :-1]
    a.lse[...] = out["lse"]


def test_repeat_finds_a_nondeterministic_python_kernel():
    r = mlagate.run({"numpy.mla": numpy_mla.BACKEND, "noisy": mlagate.Backend(decode=noisy_decode, framework="numpy")},
                    suite="smoke", op="decode", filter="kv=auto", repeat=3, quiet=True, isolate="none")
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert all(x["status"] == "PASSED" for x in ran if x["backend"] == "numpy.mla")
    assert all(x["status"] == "NONDETERMINISTIC" for x in ran if x["backend"] == "noisy")
    assert r.exit_code == 1


@pytest.mark.parametrize("poison,status", [("nan", "NONFINITE"), ("sentinel", "INCORRECT")])
def test_an_unwritten_output_shows_the_poison(poison, status):
    r = mlagate.run({"forgetful": mlagate.Backend(decode=forgetful_decode, framework="numpy")},
                    suite="smoke", op="decode", filter="kv=auto", poison=poison, quiet=True, isolate="none")
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert ran and all(x["status"] == status for x in ran), [x["message"] for x in ran]
    assert all(f"--poison {poison}" in x["repro"] or poison == "nan" for x in ran)


# ------------------------------------------------------------------ one verdict, two ways

def test_check_gives_the_record_run_gives_for_the_same_outputs(tmp_path):
    """The same outputs through Case.check and through mlagate.run (the CLI's path): the same
    status and metrics, bit for bit."""
    r = mlagate.run({"numpy.mla": numpy_mla.BACKEND}, suite="smoke", op="decode", filter="kv=auto",
                    quiet=True, isolate="none")
    by_id = {x["id"]: x for x in r.records if x["status"] != "NOT_SUPPORTED"}
    assert by_id
    for case in mlagate.cases(suite="smoke", filter="kv=auto"):
        if case.id not in by_id:
            continue
        with case:
            ran = by_id[case.id]
            a = case.inputs("decode", framework="numpy", block_size=ran["block_size"])
            mine = case.check(numpy_mla.decode(a), block_size=ran["block_size"]).record
        assert mine["status"] == ran["status"] and mine["policy"] == ran["policy"]
        for m, n in zip(mine["metrics"], ran["metrics"]):
            for key in ("output", "max_abs", "max_rel", "nmse", "cos_diff", "max_ulp", "min_fudge",
                        "err_baseline", "worst", "nonfinite_mismatches", "passed"):
                assert m[key] == n[key], (case.id, key, m[key], n[key])


# ------------------------------------------------------------------ what the review found

def test_each_inputs_call_has_fresh_poisoned_outputs():
    case = mlagate.cases(**SMOKE_DECODE)[0]
    a = case.inputs("decode", framework="numpy")
    b = case.inputs("decode", framework="tensor")
    np.asarray(b.o_lat)[...] = 0  # written through the zero-copy view
    c = case.inputs("decode", framework="tensor")
    assert np.isnan(mlagate.to_numpy(c.o_lat)).all()  # not the last writer's values
    assert case.check(c).status == "NONFINITE"  # a kernel that wrote nothing
    assert case.check(numpy_mla.decode(a)).passed
    case.release()


def test_float64_outputs_are_rounded_once():
    case = mlagate.cases(**SMOKE_DECODE)[0]
    a = case.inputs("decode")
    v = 1 + 2.0 ** -8 + 2.0 ** -30  # just above the tie between two bfloat16s
    mlagate._mlagate.copy_into(a.o_lat, np.full(a.o_lat.shape, v), "o_lat")
    assert (np.asarray(a.o_lat) == 0x3F81).all()  # 1 + 2^-7; through float32 it would tie to 1.0
    mlagate._mlagate.copy_into(a.o_lat, np.full(a.o_lat.shape, -v, np.float32), "o_lat")
    assert (np.asarray(a.o_lat) == 0xBF80).all()  # float32 input: -(1 + 2^-8) ties to even, -1.0
    case.release()


def tampering_decode(a):
    import ctypes
    ctypes.memset(a.q_lat.__array_interface__["data"][0], 0, 16)
    return numpy_mla.decode(mlagate.Args("decode", {k: a[k] for k in a.keys()}, "numpy"))


def assigning_decode(a):
    out = numpy_mla.decode(a)
    a.o_lat = out["o_lat"]  # assignment, not a write into the array
    a.lse[...] = out["lse"]


def partial_decode(a):
    out = numpy_mla.decode(a)
    a.lse[...] = out["lse"]
    return {"o_lat": out["o_lat"]}


def test_in_place_assigned_and_partly_returned_outputs_all_count_and_inputs_are_guarded():
    r = mlagate.run({"tamper": mlagate.Backend(decode=tampering_decode, framework="tensor"),
                     "assign": mlagate.Backend(decode=assigning_decode, framework="numpy"),
                     "partial": mlagate.Backend(decode=partial_decode, framework="numpy")},
                    suite="smoke", op="decode", filter="kv=auto", quiet=True, isolate="none")
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert all(x["status"] == "INCORRECT" and "wrote into its input 'q_lat'" in x["message"]
               for x in ran if x["backend"] == "tamper")
    assert all(x["status"] == "PASSED" for x in ran if x["backend"] in ("assign", "partial")), \
        [(x["backend"], x["message"]) for x in ran]


def nested_ok():
    def inner(a):
        return numpy_mla.decode(a)
    return inner


def test_what_a_worker_cannot_import_is_refused_for_process_isolation():
    class K:
        def decode(self, a):
            return numpy_mla.decode(a)
    for fn in (nested_ok(), K().decode, lambda a: None):
        with pytest.raises(ValueError, match="isolate='process'"):
            mlagate.run({"x": mlagate.Backend(decode=fn, framework="numpy")}, suite="smoke", isolate="process")


def test_more_bad_input():
    case = mlagate.cases(**SMOKE_DECODE)[0]
    with pytest.raises(ValueError, match="power of two"):
        case.inputs("decode", block_size=48)
    with pytest.raises(mlagate.InputError, match="power of two"):
        mlagate.run({"x": mlagate.Backend(decode=numpy_mla.decode, block_sizes=(48,))}, suite="smoke")
    with pytest.raises(mlagate.InputError, match="belong to mlagate.run"):
        mlagate.cases(suite="smoke", repeat=3)
    with pytest.raises(AttributeError, match="read-only"):
        case.inputs("decode", framework="numpy").q_lat = None
    case.release()


_CALLS = 0


def stateful_decode(a):
    """Right on a worker's first call, 2% off after: a kernel whose state leaks between calls."""
    global _CALLS
    _CALLS += 1
    out = numpy_mla.decode(a)
    if _CALLS > 1:
        out["o_lat"] = out["o_lat"] * 1.02
    return out


def test_an_order_dependent_python_kernel_is_told_apart():
    r = mlagate.run({"stateful": mlagate.Backend(decode=stateful_decode, framework="numpy")},
                    suite="smoke", op="decode", filter="small_decode|small_prefill|mixed_small/tp16",
                    quiet=True, isolate="process")
    ran = [x for x in r.records if x["status"] != "NOT_SUPPORTED"]
    assert ran[0]["status"] == "PASSED"
    later = ran[1:]
    assert later and all(x["status"] == "INCORRECT" for x in later)
    assert all(x["message"].startswith("order-dependent (passes alone, fails right after ") for x in later), \
        [x["message"] for x in later]


# ------------------------------------------------------------------ --cuda-graph (host emulation)

_PREPARED = {}


def graph_prepare(a):
    _PREPARED["seq_lens"] = np.array(a.seq_lens).copy()


def graph_decode(a):
    # a decode whose schedule comes from prepare(): a call or replay without its own prepare fails
    if not np.array_equal(_PREPARED.get("seq_lens"), np.array(a.seq_lens)):
        raise RuntimeError("decode without a prepare() of its own seq_lens")
    return numpy_mla.decode(a)


def test_cuda_graph_mode_replays_a_capturable_backend_with_prepare_before_each_replay():
    capturable = mlagate.Backend(decode=graph_decode, prepare=graph_prepare, cuda_graph=True, framework="numpy",
                                 block_sizes=(16, 64))
    plain = mlagate.Backend(decode=numpy_mla.decode, framework="numpy", block_sizes=(16, 64))
    r = mlagate.run({"np.graph": capturable, "np.plain": plain}, suite="smoke", op="decode", quiet=True,
                    argv=["--cuda-graph", "--capture-sizes", "8,64,512"])
    graph = [x for x in r.records if x["backend"] == "np.graph"]
    passed = [x for x in graph if x["status"] == "PASSED"]
    assert passed and all(x["status"] in ("PASSED", "NOT_SUPPORTED") for x in graph), r.failures()
    assert all("Python graph" in x["message"] for x in passed), passed[0]["message"]
    assert any("replayed, captured at" in x["message"] for x in passed)
    others = [x for x in r.records if x["backend"] == "np.plain" and "capture size" in x["message"]]
    assert others and all(x["status"] == "NOT_SUPPORTED" and "not declared capturable" in x["message"]
                          for x in others), others
    with pytest.raises(ValueError, match="cuda_graph=True needs a decode function"):
        mlagate.Backend(prefill=numpy_mla.decode, cuda_graph=True)


# ------------------------------------------------------------------ the merge_states op

def numpy_merge(a):
    """vLLM's merge_attn_states in numpy (fp64): +inf read as an empty side, both empty -> 0, -inf."""
    pl, sl = np.asarray(a.prefix_lse, np.float64), np.asarray(a.suffix_lse, np.float64)
    pl, sl = np.where(np.isinf(pl), -np.inf, pl), np.where(np.isinf(sl), -np.inf, sl)
    m = np.maximum(pl, sl)
    empty = np.isinf(m)
    m0 = np.where(empty, 0.0, m)
    wp = np.where(np.isinf(pl), 0.0, np.exp(pl - m0))
    ws = np.where(np.isinf(sl), 0.0, np.exp(sl - m0))
    s = np.where(empty, 1.0, wp + ws)
    po, so = np.asarray(a.prefix_output, np.float64), np.asarray(a.suffix_output, np.float64)
    out = (po * wp[..., None] + so * ws[..., None]) / s[..., None]
    return {"output": out, "output_lse": np.where(empty, -np.inf, m0 + np.log(s)).astype(np.float32)}


def naive_merge(a):
    """The same with no case for infinities: NaN where both sides are empty or one is +inf."""
    pl, sl = np.asarray(a.prefix_lse, np.float64), np.asarray(a.suffix_lse, np.float64)
    m = np.maximum(pl, sl)
    with np.errstate(invalid="ignore"):
        wp, ws = np.exp(pl - m), np.exp(sl - m)
        out = (np.asarray(a.prefix_output, np.float64) * wp[..., None] +
               np.asarray(a.suffix_output, np.float64) * ws[..., None]) / (wp + ws)[..., None]
        return {"output": out, "output_lse": (m + np.log(wp + ws)).astype(np.float32)}


MERGE_DTYPES = ("bf16", "fp16", "fp32")


def test_a_python_merge_states_backend_passes_and_a_naive_one_is_caught():
    good = mlagate.run({"numpy.merge": mlagate.Backend(merge_states=numpy_merge, framework="numpy", dtypes=MERGE_DTYPES)},
                       suite="merge", filter="/t7/", quiet=True, isolate="none")
    assert good.exit_code == 0 and good.records and all(x["status"] == "PASSED" for x in good.records), good.failures()
    bad = mlagate.run({"naive.merge": mlagate.Backend(merge_states=naive_merge, framework="numpy", dtypes=MERGE_DTYPES)},
                      suite="merge", filter="/t7/", quiet=True, isolate="none")
    by_pattern = {x["id"].rsplit("lse=", 1)[1]: x["status"] for x in bad.records}
    assert bad.exit_code == 1
    assert by_pattern["ordinary"] == "PASSED" and by_pattern["both_empty"] == "NONFINITE"
    assert by_pattern["prefix_pinf"] == "NONFINITE" and by_pattern["mixed"] == "NONFINITE"


def test_merge_case_inputs_and_check():
    case = mlagate.cases(suite="merge", filter="/t7/.*f32.*lse=mixed")[0]
    s = case.spec
    assert s["merge"] and s["head_dim"] == 128 and s["lse_pattern"] == "mixed"
    a = case.inputs("merge_states", framework="numpy")
    T, N, D = s["query_lens"][0], s["num_heads"], s["head_dim"]
    assert a.prefix_output.shape == (T, N, D) and a.suffix_lse.shape == (T, N)
    assert np.isinf(a.prefix_lse).any() and np.isposinf(a.prefix_lse).any()  # empty rows, FA2's +inf among them
    assert case.check(numpy_merge(a), "merge_states")
    assert case.check(naive_merge(a), "merge_states").status == "NONFINITE"


# ------------------------------------------------------------------ layouts (cases/LAYOUTS.md)

SEEN_STRIDES = []


class _AsNumpy:
    """An Args of framework="tensor" read as framework="numpy" would hand it (numpy_mla reads it)."""

    def __init__(self, a):
        self._a = a

    def __getattr__(self, k):
        v = getattr(self._a, k)
        return mlagate.to_numpy(v) if isinstance(v, mlagate.Tensor) else v


def recording_decode(a):
    # The views as handed (zero-copy uint16 arrays: strides in bytes), then numpy_mla on them.
    SEEN_STRIDES.append((np.asarray(a.q_lat).strides, np.asarray(a.q_pe).strides, np.asarray(a.o_lat).strides,
                         np.asarray(a.lse).strides, a.q_lat.shape))
    return numpy_mla.decode(_AsNumpy(a))


def test_layouts_are_handed_only_where_declared():
    """strided_views and max_pool_bytes as the CLI's backends declare them: a backend that declares
    them gets layout strided's views (q_lat and q_pe slices of the fused q, row stride L+R; o_lat and
    lse in larger buffers) and a pool past 2^31 bytes, and passes; one that does not gets
    NOT_SUPPORTED with the reason."""
    declared = mlagate.Backend(decode=numpy_mla.decode, framework="numpy", strided_views=True, max_pool_bytes=1 << 40)
    plain = mlagate.Backend(decode=numpy_mla.decode, framework="numpy")
    r = mlagate.run({"np.layouts": declared, "np.plain": plain}, suite="layout", op="decode",
                    filter=r"^layout/small_decode/tp16/bf16/kv=auto/bs=16/seed=0/layout=(strided|pool2g)$",
                    quiet=True, isolate="none")
    by = {(x["backend"], x["id"].rsplit("=", 1)[1]): x for x in r.records}
    assert len(by) == 4, [x["id"] for x in r.records]
    for layout in ("strided", "pool2g"):
        assert by[("np.layouts", layout)]["status"] == "PASSED", by[("np.layouts", layout)]["message"]
        assert by[("np.plain", layout)]["status"] == "NOT_SUPPORTED"
    assert "declares no strided views" in by[("np.plain", "strided")]["message"]
    assert "addresses pools of at most 2147483648 bytes" in by[("np.plain", "pool2g")]["message"]

    SEEN_STRIDES.clear()
    r = mlagate.run({"t.strided": mlagate.Backend(decode=recording_decode, framework="tensor", strided_views=True)},
                    suite="layout", op="decode", filter=r"^layout/small_decode/tp16/bf16/kv=auto/bs=16/seed=0/layout=strided$",
                    quiet=True, isolate="none")
    assert [x["status"] for x in r.records] == ["PASSED"], r.failures()
    q, qpe, o, lse, (t, n, lat) = SEEN_STRIDES[0]
    assert q == qpe == (n * (lat + 64) * 2, (lat + 64) * 2, 2)  # bf16, R = 64: one fused [T, N, 576] q
    assert o == (n * (lat + 64) * 2, (lat + 64) * 2, 2)  # 64 elements of padding per head row
    assert lse == ((n + 8) * 4, 4)  # 8 heads of padding per token
    with pytest.raises(ValueError, match="max_pool_bytes"):
        mlagate.Backend(decode=numpy_mla.decode, max_pool_bytes=0)
