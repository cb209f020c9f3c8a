"""Read a run's TensorBoard scalars back: for `tmt info`, `tmt average --best` and
scripts/plot_run.py."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto.event_pb2 import SessionLog
from tensorboard.util.tensor_util import make_ndarray


class Scalar(NamedTuple):
    step: int
    value: float
    hours: float     # time since the run started, counting only the time its sittings ran


def read_scalars(logdir: Path) -> dict[str, list[Scalar]]:
    """Every scalar tag of the event files in `logdir`, each as a list sorted by step.

    A resumed run writes a new event file that starts with a purge marker at its first step:
    values at or after that step in earlier files (written after the checkpoint it resumed from)
    are dropped, as TensorBoard itself does. Hours run on across sittings without the pauses
    between them."""
    scalars: dict[str, list[Scalar]] = {}
    hours_before = 0.0
    # Event file names start with the creation time in seconds: sorting by name is by time.
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        file_start = last_time = None
        for event in EventFileLoader(str(path)).Load():
            file_start = event.wall_time if file_start is None else file_start
            last_time = event.wall_time
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                for tag, values in scalars.items():
                    scalars[tag] = [v for v in values if v.step < event.step]
            hours = hours_before + (event.wall_time - file_start) / 3600
            for value in event.summary.value:
                if value.HasField("simple_value"):         # written by older torch versions
                    number = value.simple_value
                elif value.metadata.plugin_data.plugin_name == "scalars":
                    number = float(make_ndarray(value.tensor))
                else:
                    continue
                scalars.setdefault(value.tag, []).append(Scalar(event.step, number, hours))
        if file_start is not None:
            hours_before += (last_time - file_start) / 3600
    return {tag: sorted(values, key=lambda v: v.step) for tag, values in scalars.items()}
