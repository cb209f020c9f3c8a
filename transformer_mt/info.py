"""`tmt info`: what a run is and how far it got, from its files alone (nothing is trained or
translated): the resolved config, model size, vocabularies, steps, best validation scores,
checkpoints and test evaluations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import yaml

from .checkpoint import TrainState, human_size, read_checkpoint
from .config import read_yaml
from .errors import TmtError
from .events import read_scalars
from .rundir import RunDir


def count_state_parameters(model_state: dict[str, torch.Tensor]) -> int:
    """Parameters in a model state dict, tied matrices counted once (they share memory)."""
    sizes = {(t.data_ptr(), t.shape): t.numel() for t in model_state.values()}
    return sum(sizes.values())


def _checkpoint_files(run: RunDir) -> list[dict]:
    files, seen = [], {}
    for path in sorted(run.checkpoints.glob("*.pt")):
        stat = path.stat()
        twin = seen.setdefault((stat.st_dev, stat.st_ino), path.name)
        files.append({"file": path.name, "bytes": stat.st_size,
                      "same_file_as": twin if twin != path.name else None})
    return files


def _best_validation(run: RunDir, state: TrainState | None) -> dict | None:
    """The validation best.pt was written at (by the run's train.best_metric), with its scores
    and when it happened from the TensorBoard events."""
    if state is None or not state.best_step:
        return None
    scalars = read_scalars(run.tensorboard)
    at_best = {tag.removeprefix("valid/"): value for tag, values in scalars.items()
               if tag.startswith("valid/") for value in values if value.step == state.best_step}
    hours = next(iter(at_best.values())).hours if at_best else math.nan
    # The checkpoint's own scores first; chrF, and the losses of checkpoints written before
    # they were kept, from the events.
    scores = {"loss": state.validation_loss.get(state.best_step),
              "bleu": state.validation_bleu.get(state.best_step), "chrf": None}
    for name, value in scores.items():
        if value is None:
            scores[name] = at_best[name].value if name in at_best else math.nan
    return {"metric": state.best_metric, "step": state.best_step,
            "loss": round(scores["loss"], 4), "bleu": round(scores["bleu"], 2),
            "chrf": round(scores["chrf"], 2), "hours": round(hours, 3),
            "validations": len(state.validation_bleu)}


def _evaluations(run: RunDir) -> list[dict]:
    reports = []
    for path in sorted((run.path / "eval").glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            reports.append({"report": path.name, "bleu": report["bleu"], "chrf": report["chrf"],
                            "beam_size": report["decoding"]["beam_size"]})
        except (ValueError, KeyError, TypeError):
            continue          # not a tmt evaluate report: not ours to describe
    return reports


def run_info(run_path: Path) -> dict:
    """The facts as a JSON-ready dict, plus their human-readable rendering under "text"."""
    run = RunDir(run_path)
    if not run.config.is_file():
        raise TmtError(f"{run_path} is not a tmt run directory (no config.yaml)")
    config = read_yaml(run.config)
    info: dict = {"run": str(run_path), "config": config}
    if run.last.is_file():
        saved = read_checkpoint(run.last)
        info["training"] = {"step": saved.step, "epoch": saved.epoch}
        info["model"] = {"parameters": count_state_parameters(saved.model),
                         "vocab": saved.vocab,
                         "tokenizer": config.get("tokenizer", {}).get("type", "word")}
        info["best_validation"] = _best_validation(run, saved.train)
    info["checkpoints"] = _checkpoint_files(run) if run.checkpoints.is_dir() else []
    info["evaluations"] = _evaluations(run)
    info["text"] = _render(info)
    return info


def _render(info: dict) -> str:
    lines = [f"run: {info['run']}", "config:",
             *("  " + line for line in yaml.safe_dump(info["config"], sort_keys=False)
               .splitlines())]
    if "training" not in info:
        lines.append("no checkpoint yet (checkpoints/last.pt)")
    else:
        model, training = info["model"], info["training"]
        vocab = model["vocab"] or {}
        lines.append(f"model: {model['parameters']:,} parameters; {model['tokenizer']} "
                     f"vocabulary {vocab.get('src')} source / {vocab.get('tgt')} target")
        lines.append(f"trained: {training['step']} steps, {training['epoch']} full epochs")
        best = info["best_validation"]
        lines.append("best validation: none yet" if best is None else
                     f"best validation (by {best['metric']}, best.pt): step {best['step']}, "
                     f"loss {best['loss']:.3f}, BLEU {best['bleu']:.2f}, chrF {best['chrf']:.2f} "
                     f"({best['hours']:.2f} h into training; {best['validations']} validations)")
    lines.append("checkpoints:")
    for ck in info["checkpoints"]:
        twin = f" (same file as {ck['same_file_as']})" if ck["same_file_as"] else ""
        lines.append(f"  {ck['file']:<28} {human_size(ck['bytes']):>10}{twin}")
    for ev in info["evaluations"]:
        lines.append(f"evaluation {ev['report']}: BLEU {ev['bleu']:.2f}, chrF {ev['chrf']:.2f}, "
                     f"beam {ev['beam_size']}")
    return "\n".join(lines)
