"""Markdown tables: the one writer every report, benchmark and study in this repository uses.

A table is a DataFrame (anything with ``columns`` and ``itertuples``); missing values print as
empty cells, floats with ``floatfmt`` unless ``formats`` names a format (a format spec or a
function) for their column, and every cell goes through :func:`md_cell` (a ``|`` escaped, a line
break as a space), so no text can split a row or end the table. A table written by hand (a
report's f-strings) passes its text cells through :func:`md_cell` too.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"a": [1.23456, None], "b": ["x|y", "z"], "n": [3, 4]})
    >>> print(markdown_table(df, formats={"n": lambda v: f"{v}x"}, headers={"a": "a (s)"}))
    | a (s) | b | n |
    |---|---|---|
    | 1.235 | x\\|y | 3x |
    |  | z | 4x |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from system.markdown import md_cell

__all__ = ["markdown_table"]


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v) or str(v) in ("<NA>", "NaT")


def markdown_table(
    df,
    floatfmt: str = ".4g",
    formats: Mapping[str, str | Callable[[Any], str]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (no tabulate dependency), no final newline.

    ``formats`` maps a column to a format spec (``".2f"``) or a function of the value;
    ``headers`` renames columns in the header row only.
    """
    formats = dict(formats or {})
    headers = dict(headers or {})
    columns = [str(c) for c in df.columns]

    def cell(column: str, v: Any) -> str:
        if _is_missing(v):
            return ""
        f = formats.get(column)
        if callable(f):
            text = f(v)
        elif f is not None:
            text = format(v, f)
        elif isinstance(v, float):
            text = format(v, floatfmt)
        else:
            text = str(v)
        return md_cell(text)

    head = "| " + " | ".join(md_cell(headers.get(c, c)) for c in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| " + " | ".join(cell(c, v) for c, v in zip(columns, row, strict=True)) + " |"
        for row in df.itertuples(index=False)
    ]
    return "\n".join([head, sep, *body])
