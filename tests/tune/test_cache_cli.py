"""`tessera-rewrite cache list|export|import|clear`: listing, moving and clearing records, bad
invocations, bad files and hostile imports reported in one line."""

from __future__ import annotations

import json
import sys
import warnings

import pytest

from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.records import SCHEMA
from tests.tune.cache_records import rec


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    from tessera_rw.cli import main
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))

    def run(*argv: str) -> tuple[int, str, str]:
        status = main(["cache", *argv])
        out, err = capsys.readouterr()
        return status, out, err
    return run


def test_cli_list_export_import_clear(cli, tmp_path):
    TuneCache().put(rec())
    TuneCache().put(rec(arch="A100", chosen_by="cost_model", time_us=7.25))
    status, out, _ = cli("list")
    assert status == 0
    for text in ("op", "shapes", "dtypes", "config", "µs", "chosen by", "matmul", "128x64, 64x256",
                 "2 × bf16", "H100-SXM", "128x128x32 w2x2 s3", "10.00", "on_device", "cost_model", "7.25"):
        assert text in out
    status, out, _ = cli("list", "--format", "json", "--arch", "A100")
    assert status == 0 and [r["arch"] for r in json.loads(out)] == ["A100-SXM"]
    assert cli("export", str(tmp_path / "out.json"))[:2] == (0, f"exported 2 records of cache 'default' to "
                                                                f"{tmp_path / 'out.json'}\n")
    status, out, _ = cli("import", str(tmp_path / "out.json"), "--name", "other", "--format", "json")
    assert status == 0 and json.loads(out)["imported"] == 2 and len(TuneCache("other").records()) == 2
    listed = " ".join(cli("list")[1].split())
    assert "other caches in " in listed and "/autotune: other (list one with --name NAME)" in listed
    status, _, err = cli("clear")
    assert status == 2 and "--yes" in err and "2 records" in err and len(TuneCache().records()) == 2
    assert cli("clear", "--arch", "A100", "--yes")[:2] == (0, "deleted 1 records of cache 'default' for A100\n")
    assert [r.arch for r in TuneCache().records()] == ["H100-SXM"]
    listed = " ".join(cli("list", "--arch", "A100")[1].split())
    assert "has no records for A100: tuning adds them" in listed and "┃" not in listed


def test_cli_clear_asks_on_a_terminal(cli, monkeypatch):
    TuneCache().put(rec())

    class Terminal:
        def __init__(self, answer):
            self.answer = answer

        def isatty(self):
            return True

        def readline(self):
            return self.answer
    monkeypatch.setattr("builtins.input", lambda prompt="": sys.stdin.readline().rstrip("\n"))
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    assert cli("clear")[0] == 1 and len(TuneCache().records()) == 1
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert cli("clear")[0] == 0 and TuneCache().records() == []


def test_cli_clear_of_an_empty_cache_asks_nothing(cli):
    assert cli("clear")[:2] == (0, "cache 'default' holds no records\n")
    assert json.loads(cli("clear", "--format", "json")[1]) == {"removed": 0, "name": "default", "arch": None}


@pytest.mark.parametrize("argv, says", [
    ([], "required"),
    (["frob"], "invalid choice"),
    (["export"], "FILE"),
    (["list", "--name", "../x"], "not a plain file name"),
    (["import", "/nonexistent/x.json"], "cannot read /nonexistent/x.json"),
    (["list", "--format", "yaml"], "invalid choice"),
    (["list", "--arch", "sm_99"], "unknown architecture 'sm_99'"),
    (["clear", "--arch", "h1000", "--yes"], "unknown architecture 'h1000'"),
    (["list", "--name", "nope"], "there is no autotune cache named 'nope'"),
])
def test_cli_bad_invocations_exit_2(cli, argv, says):
    status, out, err = cli(*argv)
    assert status == 2 and says in err and "Traceback" not in err


def test_cli_hostile_import_exits_2_and_names_the_file(cli, tmp_path):
    src = tmp_path / "evil.json"
    src.write_text(json.dumps({"schema": SCHEMA, "records": [{"__reduce__": "os.system"}]}))
    status, _, err = cli("import", str(src))
    assert status == 2 and str(src) in err and "records.0" in err and not TuneCache().archs()


def test_cli_reports_a_bad_file_as_one_warning_line(cli, tmp_path):
    path = TuneCache().path("H100-SXM")
    path.parent.mkdir(parents=True)
    path.write_text("{")
    status, out, err = cli("list", "--format", "json")
    assert status == 0 and json.loads(out) == []
    assert err.count("\n") == 1 and err.startswith("tessera-rewrite: warning: autotune cache file") and "moved aside" in err



def test_cli_warnings_follow_the_users_filters(cli, tmp_path):
    """`python -W ignore` silences the line; the cache's own warning is one line otherwise (above)."""
    path = TuneCache().path("H100-SXM")
    path.parent.mkdir(parents=True)
    path.write_text("{")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status, _, err = cli("list")
    assert status == 0 and "warning" not in err


def test_cli_says_which_records_hold_for_other_versions_than_this_machines(cli, tmp_path):
    from tessera_rw.tune.records import current_versions
    gpu_host = current_versions()._replace(driver="12.4")
    other = TuneCache("gpu_host")
    other.put(rec(versions=gpu_host))
    other.put(rec(shapes=((8, 8), (8, 8))))
    other.put(rec(shapes=((16, 8), (8, 8)), chosen_by="cost_model", versions=gpu_host))   # holds anywhere
    other.export(tmp_path / "from_gpu.json")
    status, out, _ = cli("import", str(tmp_path / "from_gpu.json"))
    assert status == 0 and "imported 3" in out and "1 of them hold for other versions" in " ".join(out.split())
    status, out, _ = cli("list")
    text = " ".join(out.split())
    assert "used here" in text and "no: driver" in text and "yes" in text
    assert "1 record(s) hold for other versions" in text
    status, out, _ = cli("import", str(tmp_path / "from_gpu.json"), "--name", "third", "--format", "json")
    assert json.loads(out)["other_versions"] == 1


def test_cli_list_tells_records_apart_by_signature_and_prints_whole_rows_when_piped(cli):
    wide_config = {f"option_{i}": f"value_{i}" for i in range(12)}
    TuneCache().put(rec(signature_hash="aaaaaaaaaaaaaaaa", config=wide_config, chosen_by="cost_model"))
    TuneCache().put(rec(signature_hash="bbbbbbbbbbbbbbbb", config=wide_config, chosen_by="cost_model"))
    status, out, _ = cli("list")
    lines = out.splitlines()
    assert status == 0 and "signature" in out and "aaaaaaaa" in out and "bbbbbbbb" in out
    assert "signature: a hash of what else decides the kernel" in " ".join(out.split())
    rows = [line for line in lines if "matmul" in line]
    assert len(rows) == 2 and all("cost_model" in row and "option_11=value_11" in row for row in rows)
    TuneCache().clear()
    TuneCache().put(rec())
    assert "signature" not in cli("list")[1]          # one record per op, shapes and dtypes: no column
