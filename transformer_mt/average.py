"""`tmt average`: one checkpoint whose weights are the mean of several checkpoints' weights.

Averaging the last few checkpoints of a run (Vaswani et al. averaged the last 5 or 20) often
gives a model a little better than any of them. The result holds the model, config and
tokenizers, so `tmt translate` and `tmt evaluate` load it like any checkpoint; it carries no
optimizer state, so a run cannot be resumed from it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import TmtError
from .paths import refuse_overwriting_inputs
from .rundir import BEST, LAST, RunDir

if TYPE_CHECKING:
    import torch

# torch (checkpoint.py) is imported where checkpoints are read, after every refusal: a mistaken
# command fails at once, not after seconds of imports.

log = logging.getLogger(__name__)

def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of model state dicts with the same keys and shapes. Sums are taken
    in float64, so the mean of identical checkpoints is exactly that checkpoint."""
    import torch

    first = states[0]
    for state in states[1:]:
        if state.keys() != first.keys() or any(state[k].shape != first[k].shape for k in first):
            raise TmtError("the checkpoints hold differently shaped models: only checkpoints of "
                           "one run (or of runs with the same model config) can be averaged")
    averaged: dict[str, torch.Tensor] = {}
    # Tied weights (one matrix under several names) stay one tensor, as in the checkpoints.
    shared: dict[tuple, torch.Tensor] = {}
    for key, tensor in first.items():
        storage = (tensor.data_ptr(), tensor.shape)
        if storage not in shared:
            if tensor.is_floating_point():
                total = sum(state[key].to(torch.float64) for state in states)
                shared[storage] = (total / len(states)).to(tensor.dtype)
            else:
                shared[storage] = tensor.clone()   # integer buffers (counters) are not averaged
        averaged[key] = shared[storage]
    return averaged


def _distinct(paths: list[Path]) -> list[Path]:
    """Drop repeated files: a step checkpoint can be a hard link of last.pt or best.pt."""
    kept: list[Path] = []
    for path in paths:
        if not path.is_file():
            raise TmtError(f"checkpoint not found: {path}")
        twin = next((k for k in kept if os.path.samefile(k, path)), None)
        if twin is not None:
            log.warning("%s is the same file as %s: counted once", path, twin)
        else:
            kept.append(path)
    return kept


def average_files(paths: list[Path], output: Path) -> Path:
    """Average the checkpoints at `paths` into `output`; the newest (last) one's config,
    tokenizers and step are kept."""
    paths = _distinct(paths)
    refuse_overwriting_inputs(output, [("the input checkpoint", p) for p in paths])
    if output.name in (LAST, BEST) and output.parent.name == "checkpoints":
        raise TmtError(f"--output {output} would replace the run's own {output.name} (which "
                       f"resuming and translating use); choose another file name")
    from .checkpoint import Checkpoint, human_size, read_checkpoint, save

    states = [read_checkpoint(p) for p in paths]
    newest = states[-1]
    if any(s.tokenizers != newest.tokenizers for s in states):
        raise TmtError("the checkpoints use different tokenizers: they come from different runs")
    averaged = Checkpoint(model=average_state_dicts([s.model for s in states]),
                          config=newest.config, tokenizers=newest.tokenizers, vocab=newest.vocab,
                          step=newest.step, epoch=newest.epoch,
                          averaged_from=[{"file": str(p), "step": s.step}
                                         for p, s in zip(paths, states)])
    size = save(averaged, output)
    log.info("averaged %d checkpoints (steps %s) into %s (%s)", len(paths),
             ", ".join(str(s.step) for s in states), output, human_size(size))
    return output


def _step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step"))


def select_checkpoints(run: RunDir, last: int | None, best: int | None) -> list[Path]:
    """The run's kept step checkpoints: the newest `last`, or the `best` with the best
    validation score by the run's train.best_metric, as recorded in last.pt (only checkpoints
    written at a validation have one), oldest first."""
    for option, count in (("--last", last), ("--best", best)):
        if count is not None and count < 1:
            raise TmtError(f"{option} {count}: K is how many step checkpoints to average, at "
                           f"least 1")
    kept = sorted((p for p in run.checkpoints.glob("step*.pt") if p.stem[4:].isdigit()),
                  key=_step_of)
    if not kept:
        raise TmtError(f"{run.checkpoints} has no step checkpoints (stepNNNNNNNN.pt) to average; "
                       f"train with train.keep_last > 1 to keep several")
    if best is None:
        count = last if last is not None else len(kept)
        if count > len(kept):
            raise TmtError(f"--last {count}: {run.checkpoints} keeps only {len(kept)} step "
                           f"checkpoints (train.keep_last)")
        return kept[-count:]
    from .checkpoint import best_first, read_checkpoint

    state = read_checkpoint(run.last).train if run.last.is_file() else None
    if state is None:
        raise TmtError(f"--best {best}: {run.last} with the run's validation scores is missing; "
                       f"use --last K or name the checkpoint files")
    by_step = {_step_of(p): p for p in kept}
    scored = [by_step[step] for step in best_first(state.scores()) if step in by_step]
    if best > len(scored):
        raise TmtError(f"--best {best}: only {len(scored)} of the {len(kept)} kept step "
                       f"checkpoints have a validation score (those written at a validation)")
    return sorted(scored[:best], key=_step_of)


def average_run_checkpoints(run_path: Path, last: int | None, best: int | None,
                            output: Path | None = None) -> Path:
    run = RunDir(run_path)
    paths = select_checkpoints(run, last, best)
    if output is None:
        name = f"average_best{best}.pt" if best is not None else f"average_last{len(paths)}.pt"
        output = run.checkpoints / name
    # Not only the averaged checkpoints: none of the run's step checkpoints is overwritten.
    refuse_overwriting_inputs(output, [("the input checkpoint", p) for p in paths] +
                              [("a step checkpoint of the run", p)
                               for p in sorted(run.checkpoints.glob("step*.pt"))])
    return average_files(paths, output)
