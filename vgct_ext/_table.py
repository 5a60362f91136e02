"""The one text-table renderer of vgct_ext (private): the pytest summary, the CLI and ``PairedStats.__str__``.

The layout: no box lines, columns left-aligned and two spaces apart, cell widths counted in terminal cells (rich's
measure: wide characters count 2), no colour, no markup (a cell's text is printed as is), trailing spaces
stripped. A table that fits is laid out directly (microseconds: ``PairedStats.__str__`` stays cheap); one that
does not is drawn by rich (a dependency, imported then; never by ``import vgct_ext``), which folds cells. Gate failure messages are plain
text built by :mod:`vgct_ext.method.gates`; they do not come through here.

Width rule, the same everywhere: a table at most ``width`` columns wide, where ``width`` is the terminal's when
the output is a terminal (:func:`terminal_width`; the pytest summary takes pytest's own terminal width) and
unlimited otherwise (a pipe, a file, a captured stream: every line whole, for grep and logs).

* :func:`render` -- a table whose cells are never cut: a row too wide for ``width`` folds its longest cells onto
  continuation lines.
* :func:`render_grouped` -- a table whose first ``key`` columns describe a group of rows (one gate, one
  tensor): when every column fits, one plain table; when not, each group gets heading lines (from ``heading``)
  over a table of its remaining columns, as many as fit, chosen in ``priority`` order, so numbers are never cut
  (a last line names the columns left out).
"""

from __future__ import annotations

import io
import shutil
import sys
from typing import Any, Callable, List, Optional, Sequence, TextIO

__all__ = ["GAP", "terminal_width", "cell_width", "render", "render_grouped"]

#: spaces between two columns
GAP = 2


def terminal_width(stream: Optional[TextIO] = None) -> Optional[int]:
    """The width in columns of the terminal ``stream`` (default ``sys.stdout``) writes to, or None when it is not
    a terminal (then a table is as wide as its longest row)."""
    stream = sys.stdout if stream is None else stream
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return None
    return shutil.get_terminal_size().columns


def cell_width(text: str) -> int:
    """Terminal cells ``text`` takes (rich's measure: East Asian wide characters count 2)."""
    try:
        from rich.cells import cell_len
    except ImportError:  # rich is a dependency; without it, characters
        return len(text)
    return cell_len(text)


def _natural(header: Sequence[str], rows: Sequence[Sequence[Any]], show_header: bool) -> List[int]:
    table = ([tuple(header)] if show_header else []) + [tuple(r) for r in rows]
    return [max((cell_width(str(r[i])) for r in table), default=0) for i in range(len(header))]


def render(header: Sequence[str], rows: Sequence[Sequence[Any]], width: Optional[int] = None, *,
           show_header: bool = True, indent: int = 0) -> List[str]:
    """``rows`` under ``header`` as text lines, each indented by ``indent`` spaces.

    ``width`` (columns, indent included; None: unlimited) bounds the lines: when the natural table is wider,
    rich shrinks the widest columns and folds their cells onto continuation lines -- no character is dropped.
    Every row must have ``len(header)`` cells; cells are converted with ``str``. Raises ValueError on a row of
    another length.
    """
    n = len(header)
    for r in rows:
        if len(r) != n:
            raise ValueError(f"table row has {len(r)} cells, the header {n}: {r!r}")
    natural = _natural(header, rows, show_header)
    total = indent + sum(natural) + GAP * max(0, n - 1)
    fits = width is None or total <= width
    pad = " " * indent
    try:
        if fits:
            raise ImportError  # nothing to fold: the layout rich would draw, without the cost of a rich Table
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # (rich is a dependency; without it, a table that does not fit is drawn whole)
        body = ([tuple(header)] if show_header else []) + [tuple(r) for r in rows]
        return [(pad + (" " * GAP).join(str(c) + " " * (natural[i] - cell_width(str(c))) for i, c in enumerate(r)))
                .rstrip() for r in body]
    avail = max(20, width - indent)  # type: ignore[operator]  # rich's console width: what the indent leaves
    table = Table(box=None, show_edge=False, pad_edge=False, show_header=show_header, padding=(0, GAP, 0, 0),
                  header_style=None, expand=False)
    for h in header:  # (pad_edge=False: no padding right of the last column)
        table.add_column(Text(str(h)), overflow="fold")
    for r in rows:
        table.add_row(*(Text(str(c)) for c in r))
    buf = io.StringIO()
    Console(file=buf, width=avail, color_system=None, force_terminal=False, force_jupyter=False,
            highlight=False, emoji=False, markup=False, soft_wrap=False, legacy_windows=False).print(table)
    return [(pad + ln).rstrip() for ln in buf.getvalue().splitlines()]


def render_grouped(header: Sequence[str], rows: Sequence[Sequence[Any]], width: Optional[int], *, key: int,
                   heading: Callable[[Sequence[str]], List[str]], priority: Sequence[int],
                   min_columns: int = 2) -> List[str]:
    """A table of groups: a row whose first ``key`` cells are not all empty starts a group, the rows after it
    with ``key`` empty cells continue it.

    When the whole table fits in ``width`` (None: unlimited), it is :func:`render`'s one table. Otherwise each
    group is printed as ``heading(first key cells as str)`` -- lines, each cut with "..." to ``width`` -- over a
    table (indented by 2, header on the first group only) of the columns ``priority`` lists (indices >= ``key``,
    most important first) that fit in ``width``, at least ``min_columns`` of them, in the header's order: cells
    of the kept columns are never cut. A last line names the columns left out, if any.
    """
    n = len(header)
    natural = _natural(header, rows, True)
    if width is None or sum(natural) + GAP * (n - 1) <= width:
        return render(header, rows, width)
    keep: List[int] = []
    used = 2 - GAP
    for i in priority:
        if used + GAP + natural[i] <= width or len(keep) < min_columns:
            keep.append(i)
            used += GAP + natural[i]
    keep.sort()
    sub_header = tuple(header[i] for i in keep)
    groups: List[tuple] = []
    for r in rows:
        if any(str(c) for c in r[:key]) or not groups:
            groups.append((tuple(str(c) for c in r[:key]), []))
        groups[-1][1].append(tuple(r[i] for i in keep))
    out: List[str] = []
    for g, (head, body) in enumerate(groups):
        for line in heading(head):
            out.append(line if cell_width(line) <= width else _cut(line, width))
        out += render(sub_header, body, width, show_header=g == 0, indent=2)
    dropped = [header[i] for i in range(key, n) if i not in keep]
    if dropped:
        note = f"(not shown at this width: {', '.join(dropped)})"
        out.append(note if cell_width(note) <= width else _cut(" " + note, width).lstrip())
    return out


def _cut(line: str, width: int) -> str:
    """``line`` cut to ``width`` cells with "...": a line starting with a space keeps its start (a description),
    any other its end (a test id: the function name is at the end)."""
    if width <= 3:
        return line[:max(0, width)]
    if line.startswith(" "):
        return line[:width - 3] + "..."
    return "..." + line[len(line) - (width - 3):]
