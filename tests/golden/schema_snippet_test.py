"""Runs the h5py snippet of golden/SCHEMA.md on a freshly exported smoke golden
file: h5py reads the file, gathers each case's cache through its block table and
numpy recomputes every case's reference to 1e-10. A copy whose stored golden is
moved by 1e-8 must then fail the same snippet (the check can fail).
Usage: schema_snippet_test.py MLAGATE SCHEMA.md"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py

mlagate, schema_md = sys.argv[1], sys.argv[2]
text = open(schema_md, encoding="utf-8").read()
section = text.split("## Reading a case with h5py", 1)[1]
snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)

with tempfile.TemporaryDirectory() as tmp:
    golden = os.path.join(tmp, "smoke.h5")
    subprocess.run([mlagate, "export", "--suite", "smoke", "--out", golden], check=True)
    script = os.path.join(tmp, "snippet.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(snippet)
    with h5py.File(golden, "r") as f:
        ids = [x.decode() for x in f["case_ids"][()]]
    assert ids, "no case exported"
    failed = 0
    for case_id in ids:
        r = subprocess.run([sys.executable, script, golden, case_id])
        failed += r.returncode != 0
    # A golden moved by 1e-8 relative must be caught.
    moved = os.path.join(tmp, "moved.h5")
    shutil.copyfile(golden, moved)
    with h5py.File(moved, "r+") as f:
        out = f["cases/" + ids[0] + "/golden/out"]
        out[...] = out[()] * (1 + 1e-8)
    r = subprocess.run([sys.executable, script, moved, ids[0]])
    if r.returncode == 0:
        print("the snippet accepted a golden moved by 1e-8", file=sys.stderr)
        failed += 1
    sys.exit(1 if failed else 0)
