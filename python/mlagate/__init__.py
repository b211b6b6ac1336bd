"""mlagate from Python: MLA kernels under test on the same C++ core as the CLI.

    import mlagate, torch

    def my_decode(a):                       # a.q_lat, a.q_pe, a.kv_cache, ... as torch tensors
        a.o_lat.copy_(...); a.lse.copy_(...)  # or return {"o_lat": ..., "lse": ...}

    mlagate.run(backends={"mine": my_decode}, suite="vllm")   # the CLI's run, reports and exit code

    for case in mlagate.cases(suite="vllm"):                   # or a case at a time
        a = case.inputs("decode", framework="torch")
        my_decode(a)
        assert case.check(a), case.check(a).message

Keyword arguments become the CLI's flags (kv_cache_dtype="fp8" is --kv-cache-dtype fp8,
a list repeats the flag, True is a bare flag): one set of names, one set of rules.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import traceback
from typing import Any, Callable, Iterable, Mapping

from . import _mlagate
from ._mlagate import InputError, Tensor

__all__ = ["Args", "Backend", "Case", "CheckResult", "InputError", "NotSupported", "RunResult", "Tensor",
           "cases", "run", "to_numpy", "flags"]
__version__ = _mlagate.__version__

KERNEL_OPS = ("decode", "prefill", "sparse_decode", "sparse_prefill", "merge_states")


class NotSupported(Exception):
    """Raised by a backend function (or returned as a reason by supports) for a case it does not take:
    the record is NOT_SUPPORTED with this message, never a failure."""


def flags(**kwargs: Any) -> list[str]:
    """Keyword arguments as CLI flags: name_with_underscores=v -> --name-with-underscores v; a list or
    tuple repeats the flag; True is the bare flag; None and False are left out."""
    out: list[str] = []
    for key, value in kwargs.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


# ----------------------------------------------------------------------------- tensors

def _torch():
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("mlagate: this needs torch (framework='torch' or device='cuda')") from e
    return torch


def to_numpy(t: Any):
    """A tensor (mlagate.Tensor, torch.Tensor, numpy array) as a numpy array; bfloat16 becomes float32
    (numpy has no bfloat16), every other dtype is kept; mlagate.Tensors of other dtypes are zero-copy."""
    import numpy as np  # noqa: PLC0415
    if isinstance(t, Tensor):
        a = np.asarray(t)
        if t.dtype == "bfloat16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return a
    if hasattr(t, "detach"):  # torch
        t = t.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.numpy()
    return np.asarray(t)


def _host(value: Any, what: str = "output") -> Any:
    """An output on its way to the C++ side: torch tensors to the host, lists to numpy."""
    flags = getattr(value, "flags", None)
    if flags is not None and hasattr(flags, "writeable") and not flags.writeable:
        value = value.copy()  # numpy refuses to export read-only arrays through DLPack
    if hasattr(value, "__dlpack__"):
        if hasattr(value, "detach"):
            value = value.detach()
            if getattr(value, "is_cuda", False) or str(getattr(value, "device", "cpu")) != "cpu":
                value = value.cpu()
        return value
    import numpy as np  # noqa: PLC0415
    arr = np.asarray(value)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{what}: expected a tensor (a torch.Tensor or numpy array: anything with __dlpack__), "
                        f"got {type(value).__name__}")
    return np.ascontiguousarray(arr)


class Args:
    """A kernel-level op's arguments (attribute or item access): tensors converted for the framework
    asked for, numbers as they are. `outputs` names the tensors the kernel writes (o_lat or o, and lse),
    pre-filled with the poison pattern so that an element left unwritten is caught."""

    def __init__(self, op: str, raw: Mapping[str, Any], framework: str = "tensor", device: str = "cpu",
                 taken_block_size: int = 0):
        self.taken_block_size = taken_block_size  # the block_size asked of Case.inputs (check() reuses it)
        self.op = op
        self.outputs = tuple(_mlagate.op_outputs(op))
        self.framework, self.device = framework, device
        self._raw = dict(raw)
        self._values: dict[str, Any] = {}
        for name, v in self._raw.items():
            self._values[name] = self._convert(name, v) if isinstance(v, Tensor) else v

    def _convert(self, name: str, t: Tensor) -> Any:
        if self.framework == "tensor":
            return t
        if self.framework == "numpy":
            if name in self.outputs:  # a scratch array (float32 where numpy lacks the dtype), copied back
                import numpy as np  # noqa: PLC0415
                return np.array(to_numpy(t), copy=True)
            return to_numpy(t)
        torch = _torch()
        x = torch.from_dlpack(t)  # zero-copy on the host
        if self.device != "cpu":
            x = x.to(self.device)  # a copy (the poison of outputs included)
        return x

    def _write_back(self, skip: Iterable[str] = ()) -> None:
        """Outputs computed somewhere other than in place (the GPU, numpy scratch arrays) or assigned
        (a.o_lat = x) copied into the runner's buffers."""
        in_place = self.framework == "tensor" or (self.framework == "torch" and self.device == "cpu")
        assigned = self.__dict__.get("_assigned", set())
        for name in self.outputs:
            if name in skip or (in_place and name not in assigned):
                continue
            _mlagate.copy_into(self._raw[name], _host(self._values[name], f"output '{name}'"), f"output '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        # `a.o_lat = result` replaces the output (copied back like a returned one); inputs are not assignable.
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            if name not in self.__dict__["outputs"]:
                raise AttributeError(f"'{name}' is an input of {self.op}: inputs are read-only")
            values[name] = value
            self.__dict__.setdefault("_assigned", set()).add(name)
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"{self.__dict__.get('op', '?')} has no argument '{name}' "
                                 f"(it has {', '.join(self.__dict__.get('_values', {}))})") from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def keys(self):
        return self._values.keys()

    def __repr__(self) -> str:
        return f"mlagate.Args({self.op}: {', '.join(self._values)})"


def _describe(e: BaseException) -> str:
    """One line: the exception and where in the user's code it was raised."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


# ----------------------------------------------------------------------------- backends

class Backend:
    """A backend written in Python: a function per kernel-level op and its capabilities, as the
    CLI's backends declare them (the same supports() reasons: "block size 16 not in {64}").

    Each function takes an Args; it writes the outputs in place or returns them (a dict by name, or a
    tuple in the order of args.outputs), in the output dtype or float32/float64 (rounded to it).
    framework: "torch" (the default when torch imports, else "numpy"), "numpy" or "tensor"
    (mlagate.Tensor, DLPack). device: "cpu", or "cuda" (torch tensors on the GPU, outputs copied back).
    supports(case_spec: dict, op: str) -> None when supported, else the reason (a str).
    merge_states(args): vLLM's merge_attn_states on merge cases (args.prefix_output, prefix_lse,
    suffix_output, suffix_lse -> args.output, output_lse; lse [T, N] float32); give dtypes
    ("bf16", "fp16", "fp32") to take every merge case.
    prepare(args): called before every decode call with the call's Args (eager calls, and before each
    replay under --cuda-graph): what a serving engine runs outside its graph (split counts, tile
    metadata), written into tensors of your own, in place.
    cuda_graph=True: the decode function may be captured (--cuda-graph, harness/run/SERVING.md). With
    device="cuda" it is captured once per capture size in a torch.cuda.CUDAGraph over persistent
    device tensors (args' tensors keep their addresses; each replay copies the new batch into them,
    calls prepare, replays, and copies the outputs back); it must write args.o_lat and args.lse in
    place and launch on torch's current stream. With device="cpu" the call runs on persistent buffers
    (a host emulation).
    strided_views=True: decode gets layout strided's views as they are (cases/LAYOUTS.md): q_lat and
    q_pe slices of one fused [T, N, L+R] tensor, o_lat and lse in larger buffers (their strides
    show in torch and numpy; write into them in place, or return the outputs). Without it those
    records are NOT_SUPPORTED. max_pool_bytes: the largest page pool the kernel addresses (default
    2^31); the pool2g / pool4g layouts' kv_cache is the whole pool (its gap reads as zeros).
    """

    def __init__(self, decode: Callable | None = None, prefill: Callable | None = None,
                 sparse_decode: Callable | None = None, sparse_prefill: Callable | None = None,
                 merge_states: Callable | None = None, *,
                 block_sizes: Iterable[int] = (16, 64), dtypes: Iterable[str] = ("bf16", "fp16"),
                 kv_dtypes: Iterable[str] = ("auto",), query_len_support: str = "varlen",
                 reorder_threshold: int = 1, supports: Callable | None = None, framework: str | None = None,
                 device: str = "cpu", description: str = "", name: str | None = None,
                 cuda_graph: bool = False, prepare: Callable | None = None,
                 strided_views: bool = False, max_pool_bytes: int | None = None):
        self.fns = {op: fn for op, fn in (("decode", decode), ("prefill", prefill),
                                          ("sparse_decode", sparse_decode), ("sparse_prefill", sparse_prefill),
                                          ("merge_states", merge_states))
                    if fn is not None}
        if not self.fns:
            raise ValueError("mlagate.Backend: give at least one of decode, prefill, sparse_decode, sparse_prefill, "
                             "merge_states")
        for op, fn in self.fns.items():
            if not callable(fn):
                raise TypeError(f"mlagate.Backend: {op} must be callable, not {type(fn).__name__}")
        if supports is not None and not callable(supports):
            raise TypeError("mlagate.Backend: supports must be callable")
        if framework is None:
            try:
                import torch  # noqa: F401, PLC0415
                framework = "torch"
            except ImportError:
                framework = "numpy"
        if framework not in ("torch", "numpy", "tensor"):
            raise ValueError(f"mlagate.Backend: framework '{framework}' (expected torch, numpy or tensor)")
        if device != "cpu" and framework != "torch":
            raise ValueError("mlagate.Backend: device other than cpu needs framework='torch'")
        self.ops = list(self.fns)
        self.block_sizes = [int(b) for b in block_sizes]
        self.dtypes = list(dtypes)
        self.kv_dtypes = list(kv_dtypes)
        self.query_len_support = query_len_support
        self.reorder_threshold = int(reorder_threshold)
        self.user_supports = supports
        if prepare is not None and not callable(prepare):
            raise TypeError("mlagate.Backend: prepare must be callable")
        if cuda_graph and "decode" not in self.fns:
            raise ValueError("mlagate.Backend: cuda_graph=True needs a decode function (graphs capture decode)")
        self.cuda_graph, self.prepare = bool(cuda_graph), prepare
        self.strided_views = bool(strided_views)
        if max_pool_bytes is not None and int(max_pool_bytes) < 1:
            raise ValueError("mlagate.Backend: max_pool_bytes must be positive (bytes of the largest pool addressed)")
        self.max_pool_bytes = None if max_pool_bytes is None else int(max_pool_bytes)
        self.framework, self.device = framework, device
        self.name = name or ""
        self.description = description or "Python: " + ", ".join(
            f"{op}={getattr(fn, '__qualname__', repr(fn))}" for op, fn in self.fns.items())

    # Called by the C++ core (python/py_backend.cpp) for every kernel call.
    def _dispatch(self, op: str, raw: dict):
        fn = self.fns.get(op)
        if fn is None:
            return ("not_supported", f"{self.name} has no {op} function")
        try:
            args = Args(op, raw, self.framework, self.device)
        except Exception as e:  # noqa: BLE001 - e.g. no GPU for device='cuda'
            return ("error", "preparing the arguments: " + _describe(e))
        try:
            if op == "decode" and self.prepare is not None:
                self.prepare(args)
            result = fn(args)
            if self.device != "cpu":
                _torch().cuda.synchronize()  # errors of asynchronous kernels belong to this call
        except NotSupported as e:
            return ("not_supported", str(e))
        except Exception as e:  # noqa: BLE001 - any error of the kernel is its record
            return ("error", _describe(e))
        try:
            if result is not None:
                if isinstance(result, Mapping):
                    unknown = set(result) - set(args.outputs)
                    if unknown:
                        return ("wrong_output", f"returned unknown outputs {sorted(unknown)} (expected {args.outputs})")
                    items = result.items()
                else:
                    result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
                    if len(result) != len(args.outputs):
                        return ("wrong_output", f"returned {len(result)} outputs, expected {len(args.outputs)} "
                                                f"({', '.join(args.outputs)})")
                    items = zip(args.outputs, result)
                returned = []
                for name, value in items:
                    _mlagate.copy_into(raw[name], _host(value, f"output '{name}'"), f"output '{name}'")
                    returned.append(name)
                args._write_back(skip=returned)  # the outputs not returned were written in place
            else:
                args._write_back()
        except (TypeError, ValueError, BufferError) as e:
            return ("wrong_output", str(e))
        return None

    # Called by the C++ core for --cuda-graph: a _DecodeGraph, or (kind, message) as _dispatch answers.
    def _capture_decode(self, raw: dict):
        if self.device == "cpu":
            return _HostDecodeGraph(self, raw)
        try:
            return _TorchDecodeGraph(self, raw)
        except NotSupported as e:
            return ("not_supported", str(e))
        except Exception as e:  # noqa: BLE001 - the capture's error is the record's
            return ("error", "capturing the decode in a torch.cuda.CUDAGraph: " + _describe(e))

    def _supports(self, spec: dict, op: str):
        if self.user_supports is None:
            return None
        try:
            why = self.user_supports(spec, op)
        except NotSupported as e:
            return str(e)
        if why is None or why is True:
            return None
        return "not supported" if why is False else str(why)

    # How a worker process finds the same functions again (None: it cannot).
    def _import_spec(self) -> dict | None:
        refs = {}
        for key, fn in list(self.fns.items()) + [("supports", self.user_supports), ("prepare", self.prepare)]:
            if fn is None:
                continue
            ref = _function_ref(fn)
            if ref is None:
                return None
            refs[key] = ref
        return {"name": self.name, "description": self.description, "fns": refs,
                "block_sizes": self.block_sizes, "dtypes": self.dtypes, "kv_dtypes": self.kv_dtypes,
                "query_len_support": self.query_len_support, "reorder_threshold": self.reorder_threshold,
                "framework": self.framework, "device": self.device, "cuda_graph": self.cuda_graph,
                "strided_views": self.strided_views, "max_pool_bytes": self.max_pool_bytes}


class _HostDecodeGraph:
    """--cuda-graph for device="cpu": the core hands over the same persistent host buffers every
    replay; prepare and decode run on them (a host emulation of a captured graph)."""

    def __init__(self, backend: "Backend", raw: dict):
        self.backend = backend
        self.replay(raw)  # the capture runs the work once, as stream capture's warm-up does

    def replay(self, raw: dict):
        return self.backend._dispatch("decode", raw)


class _TorchDecodeGraph:
    """--cuda-graph for device="cuda": the decode captured once in a torch.cuda.CUDAGraph over
    persistent device tensors; a replay copies the batch into them in place, calls prepare outside
    the graph, replays and copies the outputs back (outputs are never reset between replays)."""

    def __init__(self, backend: "Backend", raw: dict):
        torch = _torch()
        self.backend, self.fn = backend, backend.fns["decode"]
        self.args = Args("decode", raw, backend.framework, backend.device)
        if backend.prepare is not None:
            backend.prepare(self.args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the warm-up, as torch.cuda.graphs recommends
            if self.fn(self.args) is not None:
                raise NotSupported("under --cuda-graph the decode function writes args.o_lat and args.lse in "
                                   "place (a returned tensor is a new allocation, not the graph's output)")
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.fn(self.args)
        torch.cuda.synchronize()

    def replay(self, raw: dict):
        torch = _torch()
        a = self.args
        try:
            for name, t in raw.items():
                if isinstance(t, Tensor) and name not in a.outputs:
                    a._values[name].copy_(torch.from_dlpack(t), non_blocking=False)
            a._raw = dict(raw)
            if self.backend.prepare is not None:
                self.backend.prepare(a)
            self.graph.replay()
            torch.cuda.synchronize()
        except NotSupported as e:
            return ("not_supported", str(e))
        except Exception as e:  # noqa: BLE001 - any error of the replay is its record
            return ("error", _describe(e))
        try:
            a._write_back()
        except (TypeError, ValueError, BufferError) as e:
            return ("wrong_output", str(e))
        return None


def _function_ref(fn: Callable) -> list | None:
    """(module, qualname, script) by which a worker finds `fn` again, or None when it cannot: a bound
    method, a lambda or nested function, a name bound to something else, or a script's function
    defined only inside its `if __name__ == "__main__":` block (the worker does not run that block)."""
    import inspect  # noqa: PLC0415
    if inspect.ismethod(fn):
        return None
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or not qualname or "<" in qualname:
        return None
    if module == "__main__":
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        if not path or "." in qualname or qualname not in _script_top_level_names(path):
            return None
        if getattr(sys.modules["__main__"], qualname, None) is not fn:
            return None
        return [module, qualname, os.path.abspath(path)]
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return [module, qualname, None] if obj is fn else None


def _import_root(ref: list) -> str | None:
    """The sys.path entry a worker or repro command needs to import a function's module."""
    module, _, script = ref
    if script:
        return os.path.dirname(script)  # loaded by its path; what it imports beside it is found there
    f = getattr(sys.modules.get(module), "__file__", None)
    if not f:
        return None
    d = os.path.dirname(os.path.abspath(f))
    if os.path.basename(f) == "__init__.py":
        d = os.path.dirname(d)
    for _ in range(module.count(".")):
        d = os.path.dirname(d)
    return d


def _script_top_level_names(path: str) -> set:
    """Names a script binds at its top level, outside `if __name__ == "__main__":` blocks."""
    import ast  # noqa: PLC0415
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return set()
    names = set()

    def visit(stmts):
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(st.name)
            elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                for t in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(st, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in st.names)
            elif isinstance(st, ast.If) and "__name__" not in ast.unparse(st.test):
                visit(st.body)
                visit(st.orelse)
            elif isinstance(st, ast.Try):
                visit(st.body)
    visit(tree.body)
    return names


# ----------------------------------------------------------------------------- cases

_LOCATION = ("flat", "request", "token", "head", "dim")


def _readable(m: dict) -> dict:
    """A record's metrics with its locations by name (the JSON report stores them as lists)."""
    m = dict(m)
    for key in ("worst", "first_nonfinite"):
        if isinstance(m.get(key), list):
            m[key] = dict(zip(_LOCATION, m[key]))
    return m


class CheckResult:
    """A verdict as the CLI records it: status ("PASSED", "INCORRECT", "NONFINITE", ...), message,
    metrics per output (max_abs, nmse, min_fudge, err_baseline, worst element, ...). Truthy when passed."""

    def __init__(self, record: dict):
        self.record = record
        self.status: str = record["status"]
        self.passed = self.status == "PASSED"
        self.message: str = record.get("message", "")
        self.metrics = {m["output"]: _readable(m) for m in record.get("metrics", [])}

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult({self.status}{': ' + self.message if self.message else ''})"


class Case:
    """One case of a suite: its spec, the inputs of a kernel-level op and the verdict of outputs.
    Inputs are generated on first use and kept until release() (or the end of a with block)."""

    def __init__(self, core: "_mlagate.Case"):
        self._core = core
        self.id: str = core.id
        self.spec: dict = core.spec

    def inputs(self, op: str = "decode", *, block_size: int = 0, framework: str = "tensor",
               device: str = "cpu") -> Args:
        """The op's arguments as a backend gets them (outputs included, poisoned), as mlagate.Tensors
        (zero-copy into torch or numpy), torch tensors (framework='torch', on the GPU with
        device='cuda') or numpy arrays. block_size: 0 is the case's own, else 64."""
        if framework not in ("torch", "numpy", "tensor"):
            raise ValueError(f"framework '{framework}' (expected torch, numpy or tensor)")
        if device != "cpu" and framework != "torch":
            framework = "torch"
        return Args(op, self._core.inputs(op, block_size), framework, device, taken_block_size=block_size)

    def check(self, outputs: Any, op: str | None = None, *, block_size: int = 0) -> CheckResult:
        """The verdict of `outputs` against the fp64 reference, with the CLI's policy and metrics.
        outputs: the Args from inputs() after the kernel wrote into it, a dict by output name, or a
        tuple in the op's output order; torch (any device), numpy or anything with __dlpack__."""
        if isinstance(outputs, Args):
            op = op or outputs.op
            block_size = block_size or outputs.taken_block_size
            outputs = {n: outputs[n] for n in outputs.outputs}
        op = op or "decode"
        names = _mlagate.op_outputs(op)
        if not isinstance(outputs, Mapping):
            outputs = tuple(outputs)
            if len(outputs) != len(names):
                raise ValueError(f"check({op}): {len(outputs)} outputs given, expected {len(names)} ({', '.join(names)})")
            outputs = dict(zip(names, outputs))
        host = {k: _host(v, f"output '{k}'") for k, v in outputs.items()}
        return CheckResult(json.loads(self._core.check(op, host, block_size))["records"][0])

    def expected(self, expect: Iterable[str], backend: str = "python", op: str = "decode", *,
                 block_size: int = 0) -> dict | None:
        """The first entry of these expectations files (harness/verdicts/VERDICTS.md) that selects this
        case run by `backend` in `op`: {id, reason, link, strict, statuses}, or None."""
        return self._core.expected(list(expect), backend, op, block_size)

    def release(self) -> None:
        """Frees the inputs, caches and references held for this case."""
        self._core.release()

    def __enter__(self) -> "Case":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"mlagate.Case({self.id})"


def cases(suite: str | None = None, filter: str | None = None, *, argv: Iterable[str] = (),  # noqa: A002
          **kwargs: Any) -> list[Case]:
    """The cases `mlagate run` would select with these flags (suite, filter, spec, tp, dtype,
    kv_cache_dtype, block_size, seed, case) and the flags that shape a verdict (policy, atol, rtol,
    fudge, baseline, poison, reference, prefill_chunk). Raises mlagate.InputError on bad flags."""
    words = flags(suite=suite, filter=filter, **kwargs) + list(argv)
    return [Case(c) for c in _mlagate.cases(words)]


# ----------------------------------------------------------------------------- run

class RunResult:
    """What a run gave: its exit code (the CLI's: 0 passed, 1 a failure, 2 input error, 4 nothing ran)
    and its records (the JSON report's)."""

    def __init__(self, exit_code: int, report: dict | None):
        self.exit_code = exit_code
        self.report = report or {}
        self.records: list[dict] = self.report.get("records", [])

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def failures(self) -> list[dict]:
        return [r for r in self.records if r["status"] in
                ("INCORRECT", "NONFINITE", "CRASHED", "TIMEOUT", "INVALID_CASE", "NONDETERMINISTIC")]

    def __repr__(self) -> str:
        return f"RunResult(exit_code={self.exit_code}, {len(self.records)} records)"


def _as_backends(backends: Mapping[str, Any] | None) -> list[Backend]:
    out = []
    for name, b in (backends or {}).items():
        if not isinstance(b, Backend):
            if not callable(b):
                raise TypeError(f"backend '{name}': expected a callable or mlagate.Backend, not {type(b).__name__}")
            b = Backend(decode=b)
        if b.name and b.name != name:
            b = _renamed(b, name)
        b.name = name
        out.append(b)
    return out


def _renamed(b: Backend, name: str) -> Backend:
    import copy  # noqa: PLC0415
    c = copy.copy(b)
    c.name = name
    return c


def run(backends: Mapping[str, Any] | None = None, *, backend: str | None = None, isolate: str | None = None,
        json: str | None = None, argv: Iterable[str] = (), **kwargs: Any) -> RunResult:  # noqa: A002
    """`mlagate run` in this process, with Python backends (name -> function or mlagate.Backend) beside
    the in-tree ones. backend: the --backend globs (default: the Python backends given, else every
    backend). isolate: "process" (workers re-import your functions by module and name, as
    multiprocessing's spawn does; the default when they are importable), or "none". Every other
    keyword is the CLI flag of that name (suite, filter, op, policy, poison, repeat, order, junit,
    markdown, html, quiet, ...); argv adds raw flags. Returns the exit code and the records."""
    if not _RUN_LOCK.acquire(blocking=False):
        raise RuntimeError("mlagate.run is already running in this process (its backends and workers are "
                           "process-wide): run one at a time")
    try:
        return _run(backends, backend, isolate, json, argv, kwargs)
    finally:
        _RUN_LOCK.release()


def _run(backends, backend, isolate, json, argv, kwargs) -> RunResult:  # noqa: A002
    if os.environ.get("MLAGATE_PY_WORKER"):
        raise RuntimeError("mlagate.run called in an isolation worker: guard the call in your script with "
                           "`if __name__ == '__main__':` (the worker imports your module to find your functions)")
    decls = _as_backends(backends)
    if backend is None:
        backend = ",".join(b.name for b in decls) if decls else "*"
    specs = [b._import_spec() for b in decls]
    importable = all(s is not None for s in specs)
    if isolate is None:
        isolate = "process" if importable else "none"
    if isolate == "process" and decls and not importable:
        raise ValueError("isolate='process': a worker must import your backend functions by module and name; "
                         "define them at the top level of a module or script (not a lambda or nested function), "
                         "or use isolate='none'")
    argv = list(argv)
    for i, word in enumerate(argv):  # a --json among the raw flags is the report to read
        if word == "--json" and i + 1 < len(argv):
            json = argv.pop(i + 1)
            argv.pop(i)
            break
        if word.startswith("--json="):
            json = argv.pop(i)[len("--json="):]
            break
    report_path, tmp = json, None
    if report_path is None:
        tmp = tempfile.NamedTemporaryFile(prefix="mlagate-", suffix=".json", delete=False)
        tmp.close()
        report_path = tmp.name
    words = ["run"] + flags(backend=backend, isolate=isolate, json=report_path, **kwargs) + list(argv)
    previous_cmd = _mlagate.worker_command()
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
    try:
        _mlagate.set_backends(decls)
        if isolate == "process":
            spec = {"sys_path": sys.path, "backends": specs}
            _mlagate.set_worker_command([sys.executable, worker, _json_dumps(spec)])
        if decls and importable:
            # Repro lines rerun a record with the same functions: the worker script, without --worker.
            import shlex  # noqa: PLC0415
            roots = sorted({r for s in specs for ref in s["fns"].values() for r in [_import_root(ref)] if r})
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            spec = {"sys_path": [here] + roots, "backends": specs}
            _mlagate.set_repro_command(" ".join(shlex.quote(w) for w in
                                                (sys.executable, worker, _json_dumps(spec, separators=(",", ":")))))
        sys.stdout.flush()
        sys.stderr.flush()
        code = _mlagate.cli_main(words)
        report = None
        try:
            with open(report_path) as f:
                report = _json_loads(f.read())
        except (OSError, ValueError):
            pass  # no report: an input error before anything ran (the exit code says so)
        return RunResult(code, report)
    finally:
        _mlagate.set_backends([])
        _mlagate.set_worker_command(previous_cmd)
        _mlagate.set_repro_command("")
        if tmp is not None:
            try:
                os.unlink(tmp.name)
            except OSError:
                pass


_RUN_LOCK = threading.Lock()
_json_dumps = __import__("json").dumps
_json_loads = __import__("json").loads
