"""Which config changes a resumed run accepts: those that keep the model's shape and data."""

from __future__ import annotations

from .checkpoint import Checkpoint
from .config import Config
from .errors import TmtError

# Changing these would not fit the saved weights, vocabulary or frozen split.
FIXED_MODEL_KEYS = ("d_model", "layers", "heads", "d_ff", "norm", "tie_embeddings")
FIXED_SECTIONS = ("data", "tokenizer")


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _is_fixed(key: str) -> bool:
    section, _, name = key.partition(".")
    return section in FIXED_SECTIONS or (section == "model" and name in FIXED_MODEL_KEYS)


def check_resume_config(cfg: Config, checkpoint: Checkpoint) -> list[str]:
    """Refuse changes to fixed keys (naming them). Returns the accepted changes, described for
    the log (written once the resume is accepted)."""
    saved = _flatten(checkpoint.settings("checkpoint").to_dict())
    new = _flatten(cfg.to_dict())
    changed = sorted(k for k in new if k not in ("name", "runs_dir") and saved.get(k) != new[k])
    refused = [k for k in changed if _is_fixed(k)]
    if refused:
        details = ", ".join(f"{k} ({saved.get(k)!r} -> {new[k]!r})" for k in refused)
        raise TmtError(f"cannot resume: the config changes what the checkpoint was trained with: "
                       f"{details}; restore them or start a new run with --run-dir")
    return [f"resume: {key} changed from {saved.get(key)!r} to {new[key]!r}" for key in changed]
