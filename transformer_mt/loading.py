"""Load the model that `--run DIR`, `--checkpoint best|last|PATH` or `--model EXPORT_DIR` name,
for `tmt translate`, `tmt evaluate` and `tmt serve` alike: a `Translator` (PyTorch, or
CTranslate2 for a ctranslate2 export) plus what it is, to report and to find its test split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import TmtError
from .rundir import RunDir, find_checkpoint, run_of_checkpoint
from .translator import Translator


@dataclass
class LoadedModel:
    translator: Translator
    weights: Path                # the checkpoint (.pt) or the export's weights file
    step: int | None
    backend: str                 # "pytorch" or "ctranslate2"
    run: RunDir | None           # the run it was trained in, when that folder is still here
    export_format: str | None = None

    @property
    def run_name(self) -> str | None:
        return self.run.path.name if self.run else None

    def identity(self) -> dict[str, Any]:
        return {"run": self.run_name, "checkpoint": str(self.weights), "step": self.step,
                "backend": self.backend, "export_format": self.export_format}

    def describe(self) -> str:
        """One line for stderr: which model answers."""
        where = f"run {self.run.path}, " if self.run else ""
        what = f"{self.export_format} export " if self.export_format else "checkpoint "
        return (f"{where}{what}{self.weights} (step {self.step}), "
                f"{self.backend} on {self.translator.device}")


def load_model(checkpoint: str | None, run: str | None, runs_dir: str, model_dir: str | None,
               device: str = "auto", **decode_changes: Any) -> LoadedModel:
    """`decode_changes` override the model's decode settings (e.g. beam_size=4,
    replace_unk=False)."""
    if model_dir is not None:
        if checkpoint is not None or run is not None:
            raise TmtError("pass --model EXPORT_DIR or --run/--checkpoint, not both")
        from .export import load_export

        folder = Path(model_dir)
        if not folder.is_dir():
            raise TmtError(f"--model folder not found: {folder}")
        translator, manifest, weights = load_export(folder, device, **decode_changes)
        source_run = Path(manifest["checkpoint"]).parent.parent
        run_dir = RunDir(source_run) if (source_run / "config.yaml").is_file() else None
        backend = "ctranslate2" if manifest["format"] == "ctranslate2" else "pytorch"
        return LoadedModel(translator, weights, manifest.get("step"), backend, run_dir,
                           manifest["format"])
    from .checkpoint import read_checkpoint

    path = find_checkpoint(checkpoint, Path(run) if run else None, Path(runs_dir))
    saved = read_checkpoint(path)
    translator = Translator.from_state(saved, str(path), device, **decode_changes)
    run_dir = RunDir(Path(run)) if run else run_of_checkpoint(path)
    return LoadedModel(translator, path, saved.step, "pytorch", run_dir)
