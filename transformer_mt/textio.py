"""Reading users' text files: UTF-8 lines with their line numbers, one clear error for the rest.

Shared by corpus loading (corpus.py), `tmt translate --input`/stdin and `tmt evaluate --src/--ref`;
it needs nothing heavier than the standard library, so translation starts without `datasets`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from .errors import TmtError


def utf8_lines(handle: BinaryIO, name: str) -> Iterator[str]:
    """The lines of a byte stream as text, without their line endings (LF or CRLF; a final newline
    adds no line) and without a UTF-8 byte-order mark. Only LF ends a line, so that line numbers
    match what editors and `wc -l` show (str.splitlines would also split at U+2028 and friends).
    Bytes that are not UTF-8 stop the reading with the line's number."""
    for number, raw in enumerate(handle, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            hint = " (it looks like UTF-16)" if raw.startswith((b"\xff\xfe", b"\xfe\xff")) else ""
            raise TmtError(f"{name}: line {number} is not UTF-8 text{hint}: {exc.reason} at byte "
                           f"{exc.start + 1} of the line; convert it to UTF-8 (e.g. iconv -f "
                           f"latin1 -t utf-8)") from None
        if number == 1:
            line = line.removeprefix("\ufeff")
        yield line.removesuffix("\n").removesuffix("\r")


def read_text_lines(path: str | Path, allow_empty: bool = False) -> list[str]:
    """All lines of a UTF-8 text file (see `utf8_lines`); an empty file is an error unless
    `allow_empty`."""
    try:
        with open(path, "rb") as handle:
            lines = list(utf8_lines(handle, str(path)))
    except OSError as exc:
        raise TmtError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not lines and not allow_empty:
        raise TmtError(f"{path} is empty: it holds no sentences")
    return lines


def chunks(items: Iterable, size: int) -> Iterator[list]:
    """`items` in lists of `size` (the last one shorter): lines read in batches."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
