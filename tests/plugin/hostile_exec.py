#!/usr/bin/env python3
"""A hostile exec backend for tests/plugin/test_exec.cpp: writes one kind of
bad decode outputs file, chosen by MODE (strided_pad: the example's right
values, written into a strided o_lat span with its padding changed).

usage: hostile_exec.py MODE BUNDLE.h5 OUTPUTS.h5
"""
import os
import sys

import h5py
import numpy as np


def past_the_view(g, res):
    """strided_pad: right values written into the o_lat span, and one element
    past a head row's end (the padding) changed: a write past the view."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "exec_python"))
    import decode as example  # pylint: disable=import-outside-toplevel

    o_lat, lse = example.decode(g)
    span = g["o_lat_span"][()].copy()
    st = [int(s) * span.itemsize for s in g["o_lat_span_strides"][()]]
    np.lib.stride_tricks.as_strided(span, o_lat.shape, st)[...] = example.narrow(o_lat, example.text(g.attrs["dtype"]))
    span[o_lat.shape[2]] ^= 1  # the first element past head row 0
    res["o_lat"] = span
    res["o_lat"].attrs["dtype"] = g["o_lat_span"].attrs["dtype"]
    res["lse"] = lse


def main(mode, bundle_path, outputs_path):
    with h5py.File(bundle_path, "r") as bundle, h5py.File(outputs_path, "w") as out:
        for name, g in bundle["calls"].items():
            res = out.create_group(f"calls/{name}")
            if mode == "strided_pad":
                past_the_view(g, res)
                continue
            T, N, L = g["q_lat"].shape
            o_lat = np.zeros((T, N, L), np.float32)
            lse = np.zeros((T, N), np.float32)
            if mode == "shape":
                o_lat = o_lat[:, :, : L - 1]
            elif mode == "dtype":
                o_lat = o_lat.astype(np.int32)
            elif mode == "bits_without_dtype":
                o_lat = o_lat.astype(np.uint16)
            elif mode == "nan":
                o_lat[0, 0, 0] = np.nan
            elif mode == "not_supported":
                res.attrs["status"] = "not_supported"
                res.attrs["message"] = "hostile: not today"
                continue
            elif mode == "error":
                res.attrs["status"] = "error"
                res.attrs["message"] = "hostile: it broke"
                continue
            elif mode != "zeros":
                sys.exit(f"unknown mode {mode}")
            res["o_lat"] = o_lat
            res["lse"] = lse


if __name__ == "__main__":
    main(*sys.argv[1:4])
