"""`python -m bench wheelhouse`: what it asks pip for and what it leaves out (no network here: the
commands are checked, not run)."""

from __future__ import annotations

import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from bench import wheelhouse


def test_the_requirements_are_the_projects_with_their_extras():
    base = wheelhouse.requirements()
    assert any(r.startswith("egglog") for r in base) and any(r.startswith("pydantic") for r in base)
    assert not any(r.startswith("pytest") for r in base)
    assert any(r.startswith("pytest") for r in wheelhouse.requirements(["dev"]))
    assert all("#" not in r and r == r.strip() for r in base)


def test_requirements_are_pinned_to_what_is_installed_here():
    pinned = wheelhouse.pinned_to_installed(["numpy>=1.26", "no-such-distribution>=1"])
    assert pinned == [f"numpy=={version('numpy')}", "no-such-distribution>=1"]


def test_the_download_asks_for_binary_wheels_of_the_target_python_and_platform(tmp_path):
    command = wheelhouse.download_command(tmp_path, "3.12", "x86_64", ["egglog==13.2.0"])
    assert command[:4] == [sys.executable, "-m", "pip", "download"] and command[-1] == "egglog==13.2.0"
    assert "--only-binary=:all:" in command and command[command.index("--python-version") + 1] == "3.12"
    platforms = [command[i + 1] for i, a in enumerate(command) if a == "--platform"]
    assert "manylinux_2_28_x86_64" in platforms and "manylinux2014_x86_64" in platforms
    assert all(p.endswith("_x86_64") for p in platforms)


def test_the_build_makes_wheels_of_the_project_and_the_example_plugin(tmp_path):
    command = wheelhouse.build_command(tmp_path)
    assert command[3] == "wheel" and "--no-deps" in command
    built = [Path(p) for p in command[-2:]]
    assert (built[0] / "pyproject.toml").exists() and built[1].name == "rmsnorm_matmul"


def test_skipped_distributions_leave_the_wheelhouse(tmp_path):
    for name in ("numpy-2.5.5-cp312-cp312-manylinux_2_28_x86_64.whl", "typing_extensions-4.16.0-py3-none-any.whl",
                 "egglog-13.2.0-cp312-cp312-manylinux2014_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    gone = wheelhouse.skip_wheels(tmp_path, ["NumPy", "typing-extensions"])
    assert sorted(p.name.split("-")[0] for p in gone) == ["numpy", "typing_extensions"]
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.whl")] == ["egglog"]


def test_notebook_only_dependencies_are_left_out(tmp_path):
    (tmp_path / "ipython-9.18.1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "egglog-13.2.0-cp312-cp312-manylinux2014_x86_64.whl").write_bytes(b"")
    wheelhouse.skip_wheels(tmp_path, wheelhouse.NOTEBOOK_ONLY)
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.whl")] == ["egglog"]


@pytest.mark.skipif(not (shutil.which("cc") and shutil.which("strip")), reason="needs a C compiler and strip")
def test_stripped_wheels_keep_their_files_and_a_true_record(tmp_path):
    import base64
    import hashlib
    import subprocess
    import zipfile
    source = tmp_path / "lib.c"
    source.write_text("int answer(void) { return 42; }\n" + "".join(
        f"static int f{i}(int x) {{ return x * {i}; }}\nint g{i}(int x) {{ return f{i}(x); }}\n" for i in range(200)))
    library = tmp_path / "lib.so"
    subprocess.run(["cc", "-g3", "-O0", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    data = library.read_bytes()

    def digest(b: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()

    init = b"x = 1\n"
    wheel = tmp_path / "pkg-1.0-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/__init__.py", init)
        z.writestr("pkg/lib.so", data)
        z.writestr("pkg.libs/libvendored-1a2b.so.1", data)     # auditwheel's: stripping would break it
        z.writestr("pkg-1.0.dist-info/RECORD", f"pkg/__init__.py,{digest(init)},6\n"
                                               f"pkg/lib.so,{digest(data)},{len(data)}\npkg-1.0.dist-info/RECORD,,\n")
    assert wheelhouse.strip_wheel(wheel) > 0
    with zipfile.ZipFile(wheel) as z:
        stripped = z.read("pkg/lib.so")
        record = {line.split(",")[0]: line.split(",")[1:] for line in z.read("pkg-1.0.dist-info/RECORD").decode().split()}
        assert z.read("pkg/__init__.py") == init
        assert z.read("pkg.libs/libvendored-1a2b.so.1") == data
    assert len(stripped) < len(data)
    assert record["pkg/lib.so"] == [digest(stripped), str(len(stripped))]
    assert record["pkg/__init__.py"] == [digest(init), "6"]


def test_a_wheel_strip_cannot_read_is_left_as_it_was(tmp_path):
    import zipfile
    wheel = tmp_path / "pkg-1.0-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/lib.so", b"not an ELF file")
    before = wheel.read_bytes()
    assert wheelhouse.strip_wheel(wheel) == 0 and wheel.read_bytes() == before
