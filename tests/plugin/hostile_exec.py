#!/usr/bin/env python3
"""A hostile exec backend for tests/plugin/test_exec.cpp: writes one kind of
bad decode outputs file, chosen by MODE.

usage: hostile_exec.py MODE BUNDLE.h5 OUTPUTS.h5
"""
import sys

import h5py
import numpy as np


def main(mode, bundle_path, outputs_path):
    with h5py.File(bundle_path, "r") as bundle, h5py.File(outputs_path, "w") as out:
        for name, g in bundle["calls"].items():
            res = out.create_group(f"calls/{name}")
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
