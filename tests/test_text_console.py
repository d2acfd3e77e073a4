"""Piped command-line text: TEXT_WIDTH columns, and no line ends in the spaces rich pads with."""

from io import StringIO
from pathlib import Path

from rich.table import Table

from tessera_rw.cli import main
from tessera_rw.text_console import TEXT_WIDTH, TrimmedLines, default_console

ROOT = Path(__file__).resolve().parents[1]


def test_trimmed_lines_drop_trailing_spaces_and_keep_a_line_printed_in_parts():
    sink = StringIO()
    stream = TrimmedLines(sink)
    stream.write("a table row   \nhalf ")
    assert sink.getvalue() == "a table row\n"          # the half line waits for its end
    stream.write("and the rest  \n")
    stream.write("no newline ")
    stream.flush()
    assert sink.getvalue() == "a table row\nhalf and the rest\nno newline "


def test_a_piped_console_is_text_width_wide_and_pads_no_line(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    console = default_console()
    table = Table("name", "value", title="a title")
    table.add_row("x", "1")
    console.print(table)
    console.print("word " * 40)                          # wraps at a space
    out = capsys.readouterr().out
    assert console.width == TEXT_WIDTH and out.count("\n") > 4
    assert all(line == line.rstrip() for line in out.splitlines())


def test_run_and_emit_cuda_lines_end_without_spaces(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    assert main(["--explain", str(ROOT / "examples/attention.py:attention"), "--run", "--emit-cuda", str(tmp_path),
                 *(f"--input={n}=1x2x64x64:bf16" for n in "qkv")]) == 0
    out = capsys.readouterr().out
    assert "ran the plan on the CPU" in out and "CUDA written to" in out
    assert all(line == line.rstrip() for line in out.splitlines())
