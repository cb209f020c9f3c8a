"""One bar and one log line per stage of a long job (data preparation at millions of pairs).

The bar (rate and ETA) goes to stderr only when it is a terminal, so logs, pipes and tests stay
clean; the summary line `stage NAME: S s, ..., peak RSS M MB` goes to the log (and so to the run's train.log),
where `scripts/bench_data.py` reads it.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from tqdm import tqdm

log = logging.getLogger(__name__)


class Progress:
    """Counts what a stage has done, and shows it on its bar when there is one."""

    def __init__(self, bar: tqdm):
        self.bar, self.done = bar, 0

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)


@contextmanager
def stage(name: str, total: int | None = None, unit: str = "pairs") -> Iterator[Progress]:
    """A progress bar for the stage `name` (advance it with `.update(n)`); its summary line is
    logged when the stage succeeds."""
    started = time.perf_counter()
    with tqdm(total=total, desc=name, unit=unit, unit_scale=True, dynamic_ncols=True,
              file=sys.stderr, disable=not sys.stderr.isatty(), leave=False) as bar:
        progress = Progress(bar)
        yield progress
    seconds = time.perf_counter() - started
    rate = f"{progress.done / seconds:,.0f}" if seconds > 0 else "-"
    # ru_maxrss: the process's peak so far (kB on Linux), what the stages up to this one needed.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    log.info("stage %s: %.1f s, %s %s (%s %s/s), peak RSS %s MB", name, seconds,
             f"{progress.done:,}", unit, rate, unit, f"{peak_mb:,}")
