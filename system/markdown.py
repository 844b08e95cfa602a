"""Markdown text shared by every report writer: the one escape of a table cell."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["md_cell"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")


def md_cell(value: Any) -> str:
    r"""``value`` as the text of one GitHub-flavoured Markdown table cell: a backslash and a ``|``
    escaped (GFM splits a row at every ``|`` not escaped), line breaks and other control
    characters as one space.

    >>> print(md_cell("a|b\nc"))
    a\|b c
    """
    text = str(value).replace("\\", "\\\\").replace("|", "\\|")
    return _CONTROL.sub(" ", text)
