"""Tables that a person can read at the console's width (80 columns when it is not known).

rich shrinks a table that is too wide by wrapping its cells at spaces, and past that it cuts values
with "…". A figure cut in half is worse than no figure, so every command prints its tables through
`print_table`: cells fold rather than end in "…", and a table whose columns cannot fit side by side
(a column per batch size, say) is printed as several tables, each repeating the leading key columns
(the row's name) beside the next group of columns that fits. The whole table, at any width, is what
`--json` gives.

rich only: board-side commands print through it as well.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def _copy(t: Table, cols: list[int], title: str | None, caption: bool = True) -> Table:
    """The columns `cols` of `t` as a table of their own, rows' styles and sections kept."""
    sub = Table(title=title, box=t.box, show_lines=t.show_lines, show_header=t.show_header,
                title_justify=t.title_justify, caption=t.caption if caption else None)
    columns = [t.columns[i] for i in cols]
    for c in columns:
        sub.add_column(c.header, justify=c.justify, style=c.style, header_style=c.header_style,
                       overflow="fold", min_width=c.min_width)
    cells = [list(c.cells) for c in columns]
    for r, row in enumerate(t.rows):
        sub.add_row(*(cell[r] for cell in cells), style=row.style, end_section=row.end_section)
    return sub


def _widths(console: Console, t: Table) -> Measurement:
    """The narrowest `t` can be with its cells wrapped at spaces, and its width when none is wrapped."""
    return Measurement.get(console, console.options.update(max_width=1 << 16), t)


def natural_width(console: Console, t: Table) -> int:
    """The width `t` takes when nothing in it is wrapped."""
    return _widths(console, t).maximum


def fit(console: Console, t: Table, key: int = 1) -> list[Table]:
    """`t` as tables that each fit `console`'s width: all of it when it fits with its cells wrapped at
    spaces, else the first `key` columns beside as many of the others as fit unwrapped, repeated."""
    width = console.width
    if _widths(console, t).minimum <= width or len(t.columns) <= key + 1:
        for c in t.columns:
            c.overflow = "fold"
        return [t]
    keys = list(range(key))
    groups: list[list[int]] = []
    group: list[int] = []
    for i in range(key, len(t.columns)):
        if group and natural_width(console, _copy(t, keys + group + [i], t.title)) > width:
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    n = len(groups)
    # the same number of tables with the columns shared out evenly, where that fits too (4 + 4, not 7 + 1)
    rest = list(range(key, len(t.columns)))
    even = [rest[j * len(rest) // n:(j + 1) * len(rest) // n] for j in range(n)]
    if all(natural_width(console, _copy(t, keys + g, t.title)) <= width for g in even):
        groups = even
    return [_copy(t, keys + g, f"{t.title} ({j}/{n})" if t.title else None, caption=j == n)
            for j, g in enumerate(groups, 1)]


def print_table(console: Console, t: Table, key: int = 1) -> None:
    """Print `t` on `console` so that no value is cut at its width (see `fit`)."""
    for part in fit(console, t, key):
        console.print(part)


def say(text: str) -> None:
    """A line of a command's summary on stdout, wrapped at spaces to the console's width, taken as written
    (a path's brackets are not markup)."""
    from fluidnpu.output import out

    out.print(text, markup=False, highlight=False)
