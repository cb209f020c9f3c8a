"""Graceful stop on SIGINT/SIGTERM: finish the step, checkpoint, exit."""

from __future__ import annotations

import logging
import signal

log = logging.getLogger(__name__)


class StopRequest:
    """First SIGINT/SIGTERM: stop after the current step and checkpoint. Second: exit at once
    (checkpoints are written atomically, so that is safe too)."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self) -> "StopRequest":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum
        # Through the log: to stderr with everything else the run prints, and into train.log.
        log.warning("%s: finishing the current step and saving a checkpoint (press Ctrl-C again "
                    "to quit at once)", signal.Signals(signum).name)
