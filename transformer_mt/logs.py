"""Where tmt's log lines go: stderr (through tqdm, so progress bars stay whole) and, for a
training run, its train.log once the start is accepted."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

log = logging.getLogger("transformer_mt")


class _TqdmHandler(logging.Handler):
    """Log lines printed through tqdm so that they do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm
        tqdm.write(self.format(record), file=sys.stderr)


def setup_logging(level: int = logging.INFO, prefix: str = "tmt",
                  hold_for_file: bool = False) -> None:
    """Log to stderr; with `hold_for_file`, also keep the records in memory until
    `log_to_file` names the file they belong in (a refused start writes no log file)."""
    log.handlers.clear()
    log.setLevel(logging.INFO)
    console = _TqdmHandler()
    console.setLevel(level)
    console.setFormatter(logging.Formatter(f"{prefix}: %(message)s"))
    log.addHandler(console)
    if hold_for_file:
        log.addHandler(logging.handlers.MemoryHandler(capacity=1 << 20,
                                                      flushLevel=logging.CRITICAL + 1))
    log.propagate = False


def log_to_file(log_file: Path) -> None:
    """Append the held records, and all later ones, to `log_file`."""
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    for held in [h for h in log.handlers if isinstance(h, logging.handlers.MemoryHandler)]:
        held.setTarget(handler)
        held.flush()
        log.removeHandler(held)
    log.addHandler(handler)
