"""Starting from a checkpoint: which config changes a resumed run accepts (those that keep the
model's shape and data; a learning rate that jumps back up after its decay is allowed with a
warning), and the checkpoint a fine-tuning run starts from (train.init_from)."""

from __future__ import annotations

import logging
from pathlib import Path

from .checkpoint import Checkpoint, read_checkpoint
from .config import Config
from .errors import TmtError
from .train_step import learning_rate

log = logging.getLogger(__name__)

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


def rising_rate_warning(cfg: Config, checkpoint: Checkpoint) -> str | None:
    """A line for the log when a resume inside a finished or running decay (train.decay_steps)
    makes the learning rate jump up again, as a larger --max-steps does: allowed (re-warming is
    a choice), but rarely what was meant."""
    saved = checkpoint.settings("checkpoint").train
    updates = checkpoint.train.updates
    if saved.decay_steps is None or updates <= saved.max_steps - saved.decay_steps:
        return None
    before, after = learning_rate(saved, updates - 1), learning_rate(cfg.train, updates)
    if after <= 1.5 * before:      # a new train.lr or a slightly longer decay: meant
        return None
    return (f"resume: the learning rate had decayed to {before:.2e} by step {checkpoint.step} "
            f"(train.decay_steps {saved.decay_steps} before step {saved.max_steps}); with "
            f"train.max_steps {cfg.train.max_steps} and train.decay_steps "
            f"{cfg.train.decay_steps} it jumps back to {after:.2e}. To extend a decayed run, "
            f"resume from a checkpoint taken before its decay began")


def read_init_checkpoint(cfg: Config) -> Checkpoint:
    """The checkpoint named by train.init_from, refused in one line unless the run's model shape
    and tokenizer section are the ones it was trained with."""
    path = Path(cfg.train.init_from).expanduser()
    if not path.is_file():
        raise TmtError(f"train.init_from: no checkpoint file {path}")
    checkpoint = read_checkpoint(path)
    if set(checkpoint.tokenizers) != {"src", "tgt"}:
        raise TmtError(f"train.init_from: {path} holds no copy of its tokenizers (written by an "
                       f"older tmt?), so a run cannot start from it")
    saved = checkpoint.settings(str(path))
    # Its weights fix the model's shape (dropout may change); its tokenizers replace the run's.
    keys = [("model", key) for key in FIXED_MODEL_KEYS] + [
        ("tokenizer", key) for key in vars(saved.tokenizer)]
    differ = [f"{section}.{key} ({theirs!r} there, {ours!r} here)" for section, key in keys
              if (ours := getattr(getattr(cfg, section), key))
              != (theirs := getattr(getattr(saved, section), key))]
    if differ:
        raise TmtError(f"train.init_from: {path} was trained with other settings: "
                       f"{', '.join(differ)}; set them as it had them")
    split_keys = [key for key in vars(saved.data) if key != "copy_augment"
                  and getattr(saved.data, key) != getattr(cfg.data, key)]
    if split_keys:
        # Another corpus is what fine-tuning is for; but the same corpus split another way
        # would put sentences the checkpoint trained on into this run's valid and test splits.
        log.warning("train.init_from: %s was trained on other data (%s differ): this run's "
                    "valid and test sentences may be ones it trained on", path,
                    ", ".join(f"data.{key}" for key in split_keys))
    return checkpoint
