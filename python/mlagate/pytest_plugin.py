"""pytest plugin: a test taking the `mlagate_case` fixture runs once per case of a suite.

    pytest -p mlagate.pytest_plugin --mlagate-suite vllm tests/test_my_kernel.py
    pytest ... -k 'vllm/decode_only/tp8/bf16/kv-auto'        # one case again (ids: '=' is '-')

    def test_my_decode(mlagate_case):
        a = mlagate_case.inputs("decode", framework="torch", device="cuda")
        my_kernel(a.q_lat, a.q_pe, a.kv_cache, ..., out=a.o_lat, lse=a.lse)
        r = mlagate_case.check(a)
        assert r, r.message

Installed with pip, pytest loads it through its entry point (pytest11, named
`mlagate.pytest_plugin`, so `-p mlagate.pytest_plugin` names the same plugin); otherwise (the
build tree, cmake --install) through `-p mlagate.pytest_plugin` or a conftest.py line
`pytest_plugins = ["mlagate.pytest_plugin"]`. A failing test's report carries
the case's CLI repro and the pytest command that reruns it alone.
"""

import re
import shlex

import pytest

import mlagate


def pytest_addoption(parser):
    g = parser.getgroup("mlagate")
    g.addoption("--mlagate-suite", default=None, help="parametrize mlagate_case tests by this suite's cases")
    g.addoption("--mlagate-filter", default=None, help="keep cases whose id matches this regex")
    g.addoption("--mlagate-flags", default="", help="more selection and policy flags of `mlagate run`, one string")
    g.addoption("--mlagate-expect", action="append", default=[],
                help="an expectations file (repeatable): cases an entry selects for --mlagate-backend and "
                     "--mlagate-op are marked xfail with its reason (strict as the entry says)")
    g.addoption("--mlagate-backend", default="python", help="the kernel's name, as expectation entries' backend globs see it")
    g.addoption("--mlagate-op", default="decode", help="the op the tests run, as expectation entries' op lists see it")


def test_id(case_id: str) -> str:
    """A case id as a pytest id that -k accepts: characters -k cannot parse ('=', ',') become '-'."""
    return re.sub(r"[^\w:+\-.\[\]/]", "-", case_id)


def pytest_generate_tests(metafunc):
    if "mlagate_case" not in metafunc.fixturenames:
        return
    opt = metafunc.config.getoption
    suite = opt("--mlagate-suite")
    if suite is None:
        metafunc.parametrize("mlagate_case", [pytest.param(None, marks=pytest.mark.skip(
            reason="no --mlagate-suite given"))], ids=["no-suite"])
        return
    cases = mlagate.cases(suite=suite, filter=opt("--mlagate-filter"), argv=shlex.split(opt("--mlagate-flags")))
    expect = opt("--mlagate-expect")
    params = []
    for c in cases:
        # A known failure (harness/verdicts/VERDICTS.md): xfail with the entry's reason; a strict
        # entry whose test passes fails the run (XPASS), as `mlagate run --expect` does.
        e = c.expected(expect, opt("--mlagate-backend"), opt("--mlagate-op")) if expect else None
        marks = [pytest.mark.xfail(reason=f"{e['id']}: {e['reason']}", strict=e["strict"])] if e else []
        params.append(pytest.param(c, marks=marks, id=test_id(c.id)))
    metafunc.parametrize("mlagate_case", params)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    case = getattr(item, "callspec", None) and item.callspec.params.get("mlagate_case")
    if case is None or not report.failed or call.when != "call":
        return
    opt = item.config.getoption
    rerun = ["pytest", "-p", "mlagate.pytest_plugin", "--mlagate-suite", opt("--mlagate-suite")]
    if opt("--mlagate-filter"):
        rerun += ["--mlagate-filter", opt("--mlagate-filter")]
    if opt("--mlagate-flags"):
        rerun += ["--mlagate-flags", opt("--mlagate-flags")]
    rerun = " ".join(shlex.quote(w) for w in rerun + [item.nodeid.split("[")[0], "-k", test_id(case.id)])
    report.sections.append(("mlagate", f"case: {case.id}\nrerun: {rerun}"))


def pytest_runtest_teardown(item):
    case = getattr(item, "callspec", None) and item.callspec.params.get("mlagate_case")
    if case is not None:
        case.release()  # one case's inputs and references at a time, as in a CLI run
