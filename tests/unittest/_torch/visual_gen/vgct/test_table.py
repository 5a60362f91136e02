"""vgct_ext._table: the one renderer of the pytest summary, the CLI tables and PairedStats.__str__.

Oracle: the cells themselves -- every character of every cell is on the page (folded, never cut), lines stay
within the width, and a table that fits is the plain left-aligned layout (columns two spaces apart).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import vgct_ext
from vgct_ext import _table

HEADER = ("tensor", "dtype (A/B)", "shape", "rel_l2", "verdict")
ROWS = [("transformer.blocks.0.attn.to_out", "bfloat16/float32", "2x4096x3072", "1.2345678901e-03", "pass"),
        ("x", "float16/float64", "4x8", "3.0000000000e-02", "FAIL")]


def _plain(header, rows, indent=0):
    """The independent layout: str.ljust to each column's widest cell, two spaces apart, stripped."""
    table = [tuple(map(str, header))] + [tuple(map(str, r)) for r in rows]
    w = [max(len(r[i]) for r in table) for i in range(len(header))]
    return [(" " * indent + "  ".join(c.ljust(w[i]) for i, c in enumerate(r))).rstrip() for r in table]


def _chars(lines):
    return "".join("".join(lines).split())


@pytest.mark.parametrize("width", [None, 200, 90])  # 90: the natural width, exactly
def test_a_table_that_fits_is_the_plain_layout(width):
    assert _table.render(HEADER, ROWS, width) == _plain(HEADER, ROWS)
    assert _table.render(HEADER, ROWS, width, indent=2, show_header=False) == _plain(HEADER, ROWS, 2)[1:]


@pytest.mark.parametrize("width", [60, 40, 25])
def test_a_narrow_table_folds_and_keeps_every_character(width):
    lines = _table.render(HEADER, ROWS, width)
    assert all(len(ln) <= width for ln in lines), [ln for ln in lines if len(ln) > width]
    assert sorted(_chars(lines)) == sorted(_chars(_plain(HEADER, ROWS)))  # nothing cut, nothing added
    assert "…" not in "".join(lines) and "..." not in "".join(lines)


def test_a_row_of_another_length_is_refused():
    with pytest.raises(ValueError, match="table row has 2 cells, the header 5"):
        _table.render(HEADER, [("a", "b")])


def test_grouped_table_narrow_keeps_the_priority_columns_whole():
    lines = _table.render_grouped(HEADER, ROWS, 30, key=3, heading=lambda h: [h[0], f"  {h[1]}  {h[2]}"],
                                  priority=(4, 3))
    assert all(len(ln) <= 30 for ln in lines), lines
    assert "1.2345678901e-03" in "\n".join(lines) and "3.0000000000e-02" in "\n".join(lines)
    # the long name is cut at its start ("..." + end), the description line at its end
    assert lines[0].startswith("...") and lines[0].endswith("attn.to_out")
    assert sum(ln.split()[:1] == ["rel_l2"] for ln in lines) == 1  # the sub-table header, on the first group only
    assert _table.render_grouped(HEADER, ROWS, None, key=3, heading=lambda h: [], priority=(4,)) == \
        _plain(HEADER, ROWS)


def test_terminal_width_is_none_off_a_terminal(tmp_path):
    with open(tmp_path / "f.txt", "w") as f:
        assert _table.terminal_width(f) is None
    assert _table.terminal_width(object()) is None  # no isatty


def _stats():
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]])
    e = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    return vgct_ext.compare(a, e, quantiles=(0.5, 0.99), dim=1)


def test_paired_stats_str_uses_the_renderer_and_fits_a_narrow_terminal(monkeypatch):
    s = _stats()
    text = str(s).splitlines()
    assert text[0] == "PairedStats"
    keys = ("pairs", "dtypes", "rel_l2", "cosine", "norms", "mean(a-e)", "max |a-e|", "max |a-e|/|e|", "max |e|",
            "p50 |a-e|", "p99 |a-e|", "mismatches", "unequal", "non-finite", "slices dim=1")
    assert len(text) == 1 + len(keys)
    col = len("max |a-e|/|e|") + 2 + 2  # indent 2, widest label, two spaces
    for line, k in zip(text[1:], keys):
        assert line.startswith("  " + k) and line[col - 2:col] == "  " and line[col] != " ", line
    monkeypatch.setattr(_table, "terminal_width", lambda stream=None: 50)
    narrow = str(s).splitlines()
    assert all(len(ln) <= 50 for ln in narrow) and len(narrow) > len(text)
    assert sorted(_chars(narrow)) == sorted(_chars(text))  # folded, nothing cut


def test_import_and_str_do_not_import_torch_nor_a_rich_table_that_fits():
    code = ("import sys, numpy as np, vgct_ext\n"
            "assert 'rich' not in sys.modules, 'rich imported by import vgct_ext'\n"
            "s = vgct_ext.compare(np.ones(3), np.ones(3))\n"
            "assert 'rich' not in sys.modules, 'rich imported by compare'\n"
            "t = str(s)\n"
            "assert 'torch' not in sys.modules and 'rich.table' not in sys.modules  # the table fits: no rich Table\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
