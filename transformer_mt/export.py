"""`tmt export`: a checkpoint as a self-contained model folder to deploy, without the run.

    EXPORT_DIR/
      tmt-model.json          manifest: format, tmt version, run, checkpoint, step, config, scores
      tokenizers/{src,tgt}.json
      README.md               a short model card
      model.safetensors       --format safetensors: the weights only (no pickle, no optimizer)
      model.bin, config.json, *_vocabulary.json    --format ctranslate2 (CTranslate2's own files)

`tmt translate/evaluate/serve --model EXPORT_DIR` load either format (`load_export`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from . import __version__
from .checkpoint import Checkpoint, read_checkpoint
from .config import config_from_dict
from .errors import TmtError
from .tokenizer import TextCodec
from .translator import Translator

MANIFEST = "tmt-model.json"
FORMATS = ("safetensors", "ctranslate2")
SAFETENSORS_FILE = "model.safetensors"
CT2_FILE = "model.bin"


def _model_card(manifest: dict) -> str:
    lines = [f"# {manifest['run'] or 'tmt model'} — English→Italian Transformer (tmt)", "",
             f"- format: {manifest['format']}"
             + (f" ({manifest['quantization']})" if manifest.get("quantization") else ""),
             f"- trained with tmt {manifest['tmt_version']}: {manifest['step']} steps; "
             f"checkpoint `{manifest['checkpoint']}`"]
    model = manifest["config"]["model"]
    lines.append(f"- model: d_model {model['d_model']}, {model['layers']} layers, "
                 f"{model['heads']} heads, d_ff {model['d_ff']}, {model['norm']}-norm")
    for name, value in manifest["scores"].items():
        lines.append(f"- {name}: {value}")
    lines += ["", "Use it with `tmt translate --model DIR`, `tmt evaluate --model DIR` or "
              "`tmt serve --model DIR`."]
    return "\n".join(lines) + "\n"


def _scores(checkpoint: Path, saved: Checkpoint) -> dict[str, Any]:
    """The validation score the checkpoint records, and the run's test reports of it."""
    scores: dict[str, Any] = {}
    if saved.train is not None:
        scores["best validation"] = saved.train.describe_best()
    eval_dir = checkpoint.resolve().parent.parent / "eval"
    for report_path in sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else []:
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
            if Path(report["checkpoint"]).resolve() == checkpoint.resolve():
                scores[f"{report['test_set']} BLEU, beam {report['decoding']['beam_size']}"] = (
                    f"{report['bleu']} (chrF2 {report['chrf']})")
        except (ValueError, KeyError, TypeError, OSError):
            continue        # not a tmt evaluate report
    return scores


def export_model(checkpoint: Path, output: Path, fmt: str, quantization: str | None) -> Path:
    """Write the export folder `output` (which must not exist yet); returns it."""
    if fmt not in FORMATS:
        raise TmtError(f"--format must be one of {', '.join(FORMATS)}")
    if fmt == "safetensors" and quantization not in (None, "float32"):
        raise TmtError("--quantization applies to --format ctranslate2 only")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise TmtError(f"--output {output} already exists; choose a new folder (tmt never "
                       f"overwrites files it did not create)")
    saved = read_checkpoint(checkpoint)
    cfg = saved.settings(str(checkpoint))
    codecs = dict(zip(("src", "tgt"), saved.codecs()))
    if fmt == "ctranslate2":
        quantization = quantization or "float32"
    manifest = {"format": fmt, "quantization": quantization, "tmt_version": __version__,
                "run": checkpoint.resolve().parent.parent.name
                if checkpoint.resolve().parent.name == "checkpoints" else None,
                "checkpoint": str(checkpoint.resolve()), "step": saved.step,
                "config": saved.config, "scores": _scores(checkpoint, saved)}
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    except OSError as exc:
        raise TmtError(f"cannot write --output {output}: {exc.strerror}") from None
    try:
        if fmt == "safetensors":
            from safetensors.torch import save_model

            from .model import build_model
            model = build_model(cfg.model, codecs["src"].vocab_size, codecs["tgt"].vocab_size,
                                cfg.tokenizer.joint)
            model.load_state_dict(saved.model)
            save_model(model, str(staging / SAFETENSORS_FILE), metadata={"format": "pt"})
        else:
            from .ctranslate import build_spec, save_spec
            spec = build_spec(cfg, saved.model, codecs["src"], codecs["tgt"])
            save_spec(spec, staging / "ct2", manifest["quantization"])
            for item in (staging / "ct2").iterdir():
                item.rename(staging / item.name)
            (staging / "ct2").rmdir()
        (staging / "tokenizers").mkdir()
        for side, codec in codecs.items():
            codec.save(staging / "tokenizers" / f"{side}.json")
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        (staging / "README.md").write_text(_model_card(manifest), encoding="utf-8")
        if output.is_dir():
            output.rmdir()                       # empty (checked above): ours to replace
        os.replace(staging, output)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)      # only the staging folder we made
        if isinstance(exc, OSError):
            raise TmtError(f"cannot write --output {output}: {exc.strerror or exc}") from None
        raise
    return output


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise TmtError(f"--model {folder} is not a tmt export (no {MANIFEST}); create one with "
                       f"tmt export")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest["format"] not in FORMATS or not isinstance(manifest["checkpoint"], str) \
                or not isinstance(manifest["config"], dict):
            raise ValueError("unexpected manifest")
    except (ValueError, KeyError, TypeError):
        raise TmtError(f"{path} is damaged; export the model again") from None
    return manifest


def load_export(folder: Path, device: str = "auto",
                **decode_changes: Any) -> tuple[Translator, dict, Path]:
    """The translator of an export folder, its manifest, and its weights file."""
    manifest = read_manifest(folder)
    cfg = config_from_dict(manifest["config"], str(folder / MANIFEST))
    src_codec = TextCodec.load(folder / "tokenizers" / "src.json")
    tgt_codec = TextCodec.load(folder / "tokenizers" / "tgt.json")
    decode_cfg = dataclasses.replace(cfg.decode, **decode_changes)
    if manifest["format"] == "ctranslate2":
        from .ctranslate import CT2Translator
        weights = folder / CT2_FILE
        if not weights.is_file():
            raise TmtError(f"{folder} lacks {CT2_FILE}; export the model again")
        return CT2Translator(folder, src_codec, tgt_codec, decode_cfg, device), \
            manifest, weights
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    from .device import pick_device
    from .model import build_model
    weights = folder / SAFETENSORS_FILE
    if not weights.is_file():
        raise TmtError(f"{folder} lacks {SAFETENSORS_FILE}; export the model again")
    model = build_model(cfg.model, src_codec.vocab_size, tgt_codec.vocab_size, cfg.tokenizer.joint)
    try:
        load_model(model, str(weights))
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise TmtError(f"{weights}: cannot load ({str(exc).splitlines()[0]}); export the model "
                       f"again") from None
    translator = Translator(model, src_codec, tgt_codec, decode_cfg, pick_device(device))
    return translator, manifest, weights
