"""mlagate's PEP 517 build backend: `pip install .` from a clone, offline, with the standard library only.

pyproject.toml names it (`build-backend = "mlagate_build"`, `backend-path = ["python/build_backend"]`)
with `requires = []`, so pip's isolated build environment installs nothing: no network, no
setuptools or scikit-build-core (Debian 12 ships no scikit-build-core). It runs CMake on the
repository, builds two targets, the Python module (`mlagate_python`) and the CLI (`mlagate`),
installs CMake's `mlagate_wheel` component (python/CMakeLists.txt: the package with its module, and
the CLI, with install-time RPATHs: nothing points into the build tree) into a staging folder and
zips that into a wheel for this interpreter and platform (e.g. cp311-cp311-linux_x86_64):

    mlagate/                         the package (pure-Python layer, _mlagate*.so, the worker)
    mlagate-X.Y.Z.data/scripts/mlagate   the CLI binary itself: pip puts it on PATH (venv/bin,
                                     ~/.local/bin), so it keeps its exit codes, signals, start-up
                                     time and /proc/self/exe workers (no Python wrapper)
    mlagate-X.Y.Z.data/data/lib/mlagate/  the libtorch reference module for the CLI (<bin>/../lib/mlagate;
                                     the package holds one for the Python module), where built
    mlagate-X.Y.Z.dist-info/         METADATA, WHEEL, entry_points.txt (pytest11:
                                     mlagate.pytest_plugin), RECORD (sha256 of every file)

Settings: `pip install . --config-settings=KEY=VALUE` (pip >= 22.1), or the environment variable
beside it (the config setting wins):

    build-dir   MLAGATE_PIP_BUILD_DIR   CMake build folder, relative to the repository; default
                                        build/pip-<interpreter tag>. An existing configured folder
                                        (e.g. build/cpu, the cpu preset) is used as it is, not
                                        reconfigured (unless cmake-args are given): only the two
                                        targets are brought up to date.
    cmake-args  MLAGATE_PIP_CMAKE_ARGS  more configure arguments, one shell-quoted string
    cuda        MLAGATE_PIP_CUDA        on|off: MLAGATE_WITH_CUDA (default: the project's, on
                                        where nvcc is found)
    torch       MLAGATE_PIP_TORCH       on|off: MLAGATE_WITH_TORCH (default on where libtorch is found)
    jobs        MLAGATE_PIP_JOBS        parallel build jobs (default CMAKE_BUILD_PARALLEL_LEVEL,
                                        else the CPU count)

A fresh folder is configured with -DMLAGATE_BUILD_TESTS=OFF -DMLAGATE_BUILD_BENCH=OFF, Release,
Ninja where it is installed, and this interpreter as Python3_EXECUTABLE.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]     # python/build_backend/ -> the repository
NAME = "mlagate"
COMPONENT = "mlagate_wheel"


def _version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*mlagate\s+VERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise RuntimeError("mlagate_build: no `project(mlagate VERSION ...)` in CMakeLists.txt")
    return m.group(1)


def _log(msg: str) -> None:
    print(f"mlagate_build: {msg}", file=sys.stderr, flush=True)


def _setting(config_settings, key: str, env: str, default=None):
    if config_settings and config_settings.get(key) not in (None, ""):
        value = config_settings[key]
        if isinstance(value, list):     # pip passes a repeated key as a list
            value = " ".join(value) if key == "cmake-args" else value[-1]
        return value
    return os.environ.get(env) or default


def _on_off(value, key: str):
    if value is None:
        return None
    v = str(value).strip().lower()
    if v in ("1", "on", "true", "yes"):
        return "ON"
    if v in ("0", "off", "false", "no"):
        return "OFF"
    raise ValueError(f"mlagate_build: {key}={value!r}: expected on or off")


def _tags() -> str:
    impl = sys.implementation.name
    if impl != "cpython":
        raise RuntimeError(f"mlagate_build: the module is a CPython extension; this is {impl}")
    nodot = f"{sys.version_info[0]}{sys.version_info[1]}"
    abi = f"cp{nodot}{getattr(sys, 'abiflags', '')}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"cp{nodot}-{abi}-{plat}"


# ---- metadata -----------------------------------------------------------------------------------

def _metadata() -> str:
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        "Summary: Differential correctness harness for MLA attention kernels: the mlagate module, "
        "CLI and pytest plugin",
        "Requires-Python: >=3.9",
        "Description-Content-Type: text/markdown",
        "",
        "The `mlagate` Python module (cases, verdicts, Python backends), the `mlagate` CLI and the "
        "pytest plugin, built from a clone of the mlagate repository (python/README.md).",
        "",
    ])


# The pytest plugin's entry point is named as its module, so `-p mlagate.pytest_plugin` (the
# documented command, and the rerun line a failing test prints) names the same plugin: pytest then
# loads it once, whichever comes first.
ENTRY_POINTS = "[pytest11]\nmlagate.pytest_plugin = mlagate.pytest_plugin\n"


def _wheel_file(tag: str) -> str:
    return ("Wheel-Version: 1.0\nGenerator: mlagate_build\nRoot-Is-Purelib: false\n"
            f"Tag: {tag}\n")


def _dist_info() -> str:
    return f"{NAME}-{_version()}.dist-info"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = Path(metadata_directory) / _dist_info()
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata())
    (d / "entry_points.txt").write_text(ENTRY_POINTS)
    (d / "WHEEL").write_text(_wheel_file(_tags()))
    return d.name


# ---- the CMake build ----------------------------------------------------------------------------

def _run(cmd: list[str]) -> None:
    _log("$ " + " ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr)   # pip shows stderr with -v and on failure


def _cache_value(cache: Path, name: str):
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith(name + ":"):
            return line.split("=", 1)[1]
    return None


def _build(config_settings, stage: Path) -> None:
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("mlagate_build: cmake not found (Debian: apt-get install cmake ninja-build; "
                           "the README's Quick start installs every package)")
    tag = sys.implementation.cache_tag            # cpython-311
    build_dir = Path(_setting(config_settings, "build-dir", "MLAGATE_PIP_BUILD_DIR", f"build/pip-{tag}"))
    if not build_dir.is_absolute():
        build_dir = ROOT / build_dir
    extra = shlex.split(_setting(config_settings, "cmake-args", "MLAGATE_PIP_CMAKE_ARGS", "") or "")
    for key, env, var in (("cuda", "MLAGATE_PIP_CUDA", "MLAGATE_WITH_CUDA"),
                          ("torch", "MLAGATE_PIP_TORCH", "MLAGATE_WITH_TORCH")):
        v = _on_off(_setting(config_settings, key, env), key)
        if v:
            extra.append(f"-D{var}={v}")
    jobs = _setting(config_settings, "jobs", "MLAGATE_PIP_JOBS",
                    os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1))

    cache = build_dir / "CMakeCache.txt"
    t0 = time.monotonic()
    if not cache.exists():
        cmd = [cmake, "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
               "-DMLAGATE_BUILD_TESTS=OFF", "-DMLAGATE_BUILD_BENCH=OFF", "-DMLAGATE_PYTHON=ON",
               f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja"):
            cmd += ["-G", "Ninja"]
        _run(cmd + extra)
    elif extra:
        _run([cmake, "-S", str(ROOT), "-B", str(build_dir)] + extra)
    else:
        _log(f"using the configured build folder {build_dir}")
    if not _cache_value(cache, "MLAGATE_PYTHON_EXECUTABLE"):
        raise RuntimeError(f"mlagate_build: {build_dir} has no Python module configured (MLAGATE_PYTHON "
                           "off, or no Python headers or pybind11: Debian: apt-get install python3-dev "
                           "pybind11-dev); its configure output says which")
    _run([cmake, "--build", str(build_dir), "--target", "mlagate_python", "mlagate", "-j", str(jobs)])
    _run([cmake, "--install", str(build_dir), "--prefix", str(stage), "--component", COMPONENT])
    _log(f"built in {time.monotonic() - t0:.1f} s")

    ext = sysconfig.get_config_var("EXT_SUFFIX")
    mods = sorted((stage / NAME).glob("_mlagate*"))
    if not mods or not mods[0].name.endswith(ext):
        raise RuntimeError(f"mlagate_build: the module in {build_dir} ({[m.name for m in mods]}) is not "
                           f"for this interpreter ({sys.executable}, {ext}): the folder was configured "
                           "with another Python; use another build-dir, or -DPython3_EXECUTABLE")
    if not (stage / "scripts" / NAME).is_file():
        raise RuntimeError(f"mlagate_build: the CLI was not installed from {build_dir}")


# ---- the wheel ----------------------------------------------------------------------------------

def _zip_entry(zf: zipfile.ZipFile, arcname: str, data: bytes, mode: int, record: list) -> None:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))   # reproducible: 1980 by default
    info = zipfile.ZipInfo(arcname, time.gmtime(max(epoch, 315532800))[:6])
    info.external_attr = ((stat.S_IFREG | (0o755 if mode & 0o111 else 0o644)) & 0xFFFF) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append((arcname, f"sha256={digest}", str(len(data))))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = _tags()
    version = _version()
    dist_info = _dist_info()
    data_dir = f"{NAME}-{version}.data"
    wheel_name = f"{NAME}-{version}-{tag}.whl"
    with tempfile.TemporaryDirectory(prefix="mlagate-wheel-") as tmp:
        stage = Path(tmp) / "stage"
        _build(config_settings, stage)
        files: list[tuple[str, Path]] = []
        for p in sorted((stage / NAME).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                files.append((p.relative_to(stage).as_posix(), p))
        files.append((f"{data_dir}/scripts/{NAME}", stage / "scripts" / NAME))
        for p in sorted((stage / "data").rglob("*")):  # the prefix's files (lib/mlagate/: the torch module)
            if p.is_file():
                files.append((f"{data_dir}/data/{p.relative_to(stage / 'data').as_posix()}", p))
        record: list = []
        out = Path(wheel_directory) / wheel_name
        tmp_out = out.with_suffix(".tmp")
        with zipfile.ZipFile(tmp_out, "w") as zf:
            for arc, p in files:
                _zip_entry(zf, arc, p.read_bytes(), p.stat().st_mode, record)
            for name, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file(tag)),
                               ("entry_points.txt", ENTRY_POINTS)):
                _zip_entry(zf, f"{dist_info}/{name}", text.encode(), 0o644, record)
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerows(record)
            w.writerow((f"{dist_info}/RECORD", "", ""))
            _zip_entry(zf, f"{dist_info}/RECORD", buf.getvalue().encode(), 0o644, [])
        os.replace(tmp_out, out)
    _log(f"wrote {out}")
    return wheel_name


# ---- the sdist: the tracked files of the git checkout -------------------------------------------

def build_sdist(sdist_directory, config_settings=None):
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                                capture_output=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"mlagate_build: an sdist is made from a git checkout (git ls-files): {e}")
    base = f"{NAME}-{_version()}"
    out = Path(sdist_directory) / f"{base}.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for rel in sorted(x.decode() for x in listed if x):
            p = ROOT / rel
            if p.is_file() or p.is_symlink():
                tf.add(str(p), arcname=f"{base}/{rel}", recursive=False)
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        info.mode = 0o644
        tf.addfile(info, io.BytesIO(pkg_info))
    return out.name
