"""`python -m bench wheelhouse`: the wheels a GPU host without internet needs to install tessera_rw.

Run it where pip reaches PyPI. It downloads binary wheels of tessera_rw's dependencies (and their
dependencies) for the target CPython version and platform, builds the wheels of tessera_rw and of
the example plugin from this checkout, leaves out what the host already has (`--skip`) and what
nothing imports at run time (egglog's notebook widgets: NOTEBOOK_ONLY), and strips the debug
information from the compiled extensions (egglog's wheel goes from 49 to 6 MiB). On the host,
each dependency being in the wheelhouse or already installed:

    python -m pip install --no-index --no-deps WHEELHOUSE/*.whl

For a host whose image has numpy, scipy, the CUDA bindings, rich and pytest (as this project's
GPU hosts do), leave those out, and take nvmath-python along for the FFT steps on cuFFT:

    python -m bench wheelhouse --python 3.12 --dest .whl --extras cufft --skip numpy scipy ml-dtypes \
        cuda-bindings cuda-python nvidia-cuda-nvrtc filelock rich markdown-it-py mdurl pygments \
        packaging typing-extensions pyyaml tqdm cloudpickle click markupsafe mypy-extensions \
        pathspec psutil

Versions are those installed here unless `--newest` is given, so the host runs what the tests here
ran with.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = (ROOT / "plugins" / "rmsnorm_matmul",)
# manylinux tags pip matches exactly: the usual ones, newest first (x86-64 by default)
MANYLINUX = ("manylinux_2_39", "manylinux_2_35", "manylinux_2_34", "manylinux_2_31", "manylinux_2_28",
             "manylinux_2_27", "manylinux_2_24", "manylinux_2_17", "manylinux2014", "manylinux1")


def requirements(extras: Sequence[str] = ()) -> list[str]:
    """tessera_rw's dependencies as pyproject.toml declares them, with those of `extras`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = list(project["dependencies"])
    for extra in extras:
        found += project.get("optional-dependencies", {}).get(extra, [])
    return [r.split("#")[0].strip() for r in dict.fromkeys(found)]


def pinned_to_installed(reqs: Sequence[str]) -> list[str]:
    """Each requirement pinned to the version installed in this environment, where there is one
    (the host then runs what the tests here ran with)."""
    from importlib.metadata import PackageNotFoundError, version
    pinned = []
    for req in reqs:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)[0]
        try:
            pinned.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pinned.append(req)
    return pinned


def platforms(machine: str) -> list[str]:
    return [f"{tag}_{machine}" for tag in MANYLINUX]


def download_command(dest: Path, python: str, machine: str, reqs: Sequence[str]) -> list[str]:
    """pip download of binary wheels of `reqs` and what they need, for CPython `python` on
    manylinux `machine`."""
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation", "cp",
               "--python-version", python, "--dest", str(dest)]
    for platform in platforms(machine):
        command += ["--platform", platform]
    return command + list(reqs)


def build_command(dest: Path) -> list[str]:
    """pip wheel of tessera_rw and the example plugin from this checkout (pure Python, any platform)."""
    return [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dest), str(ROOT), *map(str, PLUGINS)]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# egglog's declared dependencies for its notebook display: nothing tessera_rw runs imports them
NOTEBOOK_ONLY = ("anywidget", "asttokens", "comm", "executing", "ipython", "ipython-pygments-lexers", "ipywidgets",
                 "jedi", "jupyterlab-widgets", "matplotlib-inline", "parso", "pexpect", "prompt-toolkit", "psygnal",
                 "ptyprocess", "pure-eval", "stack-data", "traitlets", "wcwidth", "widgetsnbextension")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def strip_wheel(wheel: Path, strip: str = "strip") -> int:
    """Strip the debug information from the package's own shared libraries in `wheel` (in place, its
    RECORD updated); the bytes saved. Libraries auditwheel vendored (under `<name>.libs/`) are left
    as they are: their program headers were patched, and strip breaks them (numpy's OpenBLAS then
    fails to load). Where strip fails, the wheel is left as it was."""
    before = wheel.stat().st_size
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as source:
        libraries = [n for n in source.namelist()
                     if re.search(r"\.so(\.\d+)*$", n) and not n.split("/")[0].endswith(".libs")]
        if not libraries:
            return 0
        stripped = {}
        for name in libraries:
            path = Path(tmp) / Path(name).name
            path.write_bytes(source.read(name))
            try:
                subprocess.run([strip, "--strip-debug", str(path)], check=True, capture_output=True)
            except (OSError, subprocess.CalledProcessError):
                return 0
            stripped[name] = path.read_bytes()
        rebuilt = Path(tmp) / wheel.name
        with zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as out:
            for info in source.infolist():
                data = stripped.get(info.filename, None)
                data = source.read(info.filename) if data is None else data
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = []
                    for line in data.decode().splitlines():
                        name = line.split(",", 1)[0]
                        if name in stripped:
                            line = f"{name},{_record_hash(stripped[name])},{len(stripped[name])}"
                        lines.append(line)
                    data = ("\n".join(lines) + "\n").encode()
                info.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(info, data)
        shutil.move(rebuilt, wheel)
    return before - wheel.stat().st_size


def skip_wheels(dest: Path, skip: Sequence[str]) -> list[Path]:
    """Delete the wheels of the distributions named in `skip` (the host has them); the deleted paths."""
    names = {normalized(n) for n in skip}
    gone = [w for w in dest.glob("*.whl") if normalized(w.name.split("-")[0]) in names]
    for w in gone:
        w.unlink()
    return gone


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench wheelhouse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="the host's CPython version (default 3.12)")
    parser.add_argument("--machine", default="x86_64", help="the host's machine: x86_64 or aarch64")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="where the wheels go (default .whl)")
    parser.add_argument("--extras", nargs="*", default=[], help="optional dependency groups too, e.g. dev")
    parser.add_argument("--skip", nargs="*", default=[], help="distributions the host already has")
    parser.add_argument("--keep-debug-info", action="store_true",
                        help="leave the compiled extensions as released (default: debug information stripped)")
    parser.add_argument("--newest", action="store_true",
                        help="the newest releases the requirements admit (default: the versions installed here)")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    reqs = requirements(args.extras) if args.newest else pinned_to_installed(requirements(args.extras))
    for command in (download_command(args.dest, args.python, args.machine, reqs),
                    build_command(args.dest)):
        done = subprocess.run(command)
        if done.returncode:
            print(f"wheelhouse: {' '.join(command[2:4])} failed (exit {done.returncode})", file=sys.stderr)
            return done.returncode
    skipped = skip_wheels(args.dest, [*args.skip, *NOTEBOOK_ONLY])
    wheels = sorted(args.dest.glob("*.whl"))
    saved = 0 if args.keep_debug_info or not shutil.which("strip") else sum(map(strip_wheel, wheels))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB in {args.dest} ({len(skipped)} left out, {saved / 2**20:.0f} MiB "
          f"of debug information stripped). On the host:\n"
          f"  python -m pip install --no-index --no-deps {args.dest}/*.whl")
    return 0
