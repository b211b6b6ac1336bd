#!/usr/bin/env python3
# How a host's memory bandwidth and per-core vector rate hold up as processes
# run side by side (PERFORMANCE.md, "Where the time of a second GPU goes"):
# k processes each copy 512 MiB arrays, then multiply a cache-resident fp32
# matrix. Needs numpy; run with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# MKL_NUM_THREADS=1 so that each process is one thread.
import multiprocessing as mp
import sys
import time

import numpy as np


def copy(n, q):
    a = np.ones(64 << 20)  # 512 MiB
    b = np.empty_like(a)
    np.copyto(b, a)
    t = time.perf_counter()
    for _ in range(n):
        np.copyto(b, a)
    q.put((n * 2 * a.nbytes, time.perf_counter() - t))


def matmul(n, q):
    a = np.random.default_rng(0).random((256, 256), dtype=np.float32)
    b = np.empty_like(a)
    t = time.perf_counter()
    for _ in range(n):
        np.matmul(a, a, out=b)  # in cache: the vector units only
    q.put((n * 2 * 256**3, time.perf_counter() - t))


def main():
    counts = [int(x) for x in sys.argv[1:]] or [1, 4, 8, 16, 32]
    for name, f, n, unit in (("copy", copy, 6, "GB/s"), ("matmul", matmul, 3000, "GFLOP/s")):
        for k in counts:
            q = mp.Queue()
            ps = [mp.Process(target=f, args=(n, q)) for _ in range(k)]
            for p in ps:
                p.start()
            r = [q.get() for _ in ps]
            for p in ps:
                p.join()
            total = sum(b for b, _ in r) / max(t for _, t in r) / 1e9
            print(f"{name:6s} {k:2d} processes: {total:7.1f} {unit} in all, {total / k:6.1f} each", flush=True)


if __name__ == "__main__":
    main()
