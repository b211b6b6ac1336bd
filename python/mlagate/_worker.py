"""An isolation worker for mlagate.run(isolate="process"): started by the C++ core as
`python _worker.py <spec> run <flags> --worker`, it imports the user's backend functions again by
module and name (a script as a module, as multiprocessing's spawn does), registers them as they were
declared, and serves jobs with the CLI's worker protocol. Crashes stay in here.

Without --worker it is the repro command of a Python backend's records: the same CLI run, in this
process, with the same functions (`python _worker.py <spec> run --suite ... --backend mine ...`)."""

import importlib
import json
import os
import runpy
import sys


def _resolve(ref, loaded):
    module, qualname, path = ref
    if module == "__main__":
        if path not in loaded:
            # The script's top level runs again, its `if __name__ == "__main__":` block does not.
            loaded[path] = runpy.run_path(path, run_name="__mlagate_main__")
        obj = loaded[path][qualname.split(".")[0]]
        rest = qualname.split(".")[1:]
    else:
        obj = importlib.import_module(module)
        rest = qualname.split(".")
    for part in rest:
        obj = getattr(obj, part)
    return obj


def main() -> int:
    # Until the C++ worker takes stdout for its protocol, whatever the user's
    # modules print while they import goes to stderr, not into the protocol.
    protocol = os.dup(1)
    os.dup2(2, 1)
    spec = json.loads(sys.argv[1])
    here = os.path.dirname(os.path.abspath(__file__))
    # This file's folder (put first by `python _worker.py`) out; the parent's entries first.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path[:0] = [p for p in spec["sys_path"] if os.path.abspath(p or ".") != here and p not in sys.path]
    os.environ["MLAGATE_PY_WORKER"] = "1"
    import mlagate  # noqa: PLC0415

    loaded = {}
    decls = []
    for b in spec["backends"]:
        fns = {k: _resolve(v, loaded) for k, v in b["fns"].items()}
        supports = fns.pop("supports", None)
        prepare = fns.pop("prepare", None)
        d = mlagate.Backend(**fns, block_sizes=b["block_sizes"], dtypes=b["dtypes"], kv_dtypes=b["kv_dtypes"],
                            query_len_support=b["query_len_support"], reorder_threshold=b["reorder_threshold"],
                            supports=supports, framework=b["framework"], device=b["device"],
                            description=b["description"], name=b["name"],
                            cuda_graph=b.get("cuda_graph", False), prepare=prepare,
                            strided_views=b.get("strided_views", False), max_pool_bytes=b.get("max_pool_bytes"))
        decls.append(d)
    mlagate._mlagate.set_backends(decls)
    sys.stdout.flush()
    os.dup2(protocol, 1)
    os.close(protocol)
    try:
        return mlagate._mlagate.cli_main(sys.argv[2:])
    finally:
        mlagate._mlagate.set_backends([])


if __name__ == "__main__":
    sys.exit(main())
