"""Output never destroys input: the check every command runs before it opens a file to write."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .errors import TmtError

STDIO = "-"     # `--input -` reads stdin, `--output -` writes stdout


def same_file(a: str | Path, b: str | Path) -> bool:
    """True if `a` and `b` name one file: the same path once `.`, `..` and symbolic links are
    resolved, or two hard links to one inode. Paths that do not exist compare by resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def refuse_overwriting_inputs(output: str | Path | None,
                              inputs: Iterable[tuple[str, str | Path | None]],
                              option: str = "--output") -> None:
    """Stop with a TmtError if the file that `option` names (`output`) is one of `inputs`,
    (what, path) pairs. None and `-` (stdin, stdout) are no files and are skipped."""
    if output is None or str(output) == STDIO:
        return
    for what, path in inputs:
        if path is not None and str(path) != STDIO and same_file(output, path):
            raise TmtError(f"{option} {output} is the same file as {what} {path}: writing it would "
                           f"destroy that input; choose another output file")


def report_path(hyp_path: Path) -> Path:
    """Where the JSON report of the hypotheses at `hyp_path` goes: beside them, suffix .json."""
    return hyp_path.with_suffix(".json")


def refuse_overwriting_with_hypotheses(hyp_path: Path,
                                       inputs: Iterable[tuple[str, str | Path | None]]) -> None:
    """`tmt evaluate` writes two files, the hypotheses and their JSON report: neither may be an
    input, nor may the two be one file."""
    if report_path(hyp_path) == hyp_path:
        raise TmtError(f"--output {hyp_path}: the JSON report is written beside the hypotheses "
                       f"with the suffix .json, so their file must not end in .json")
    inputs = list(inputs)
    refuse_overwriting_inputs(hyp_path, inputs)
    refuse_overwriting_inputs(report_path(hyp_path), inputs, "the JSON report")
    # `tmt evaluate --json --output X.hyp > X.json`: the shell has already opened the report's
    # file as stdout, and the two writers would interleave into one corrupt file.
    for what, path in (("the hypotheses", hyp_path), ("the JSON report", report_path(hyp_path))):
        if _is_stdout(path):
            raise TmtError(f"standard output is redirected to {path}, where tmt writes "
                           f"{what}: redirect it to another file")


def _is_stdout(path: Path) -> bool:
    """True if standard output is the file at `path` (the same inode)."""
    try:
        return os.path.samestat(os.fstat(1), os.stat(path))
    except OSError:
        return False
