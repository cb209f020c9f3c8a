"""The typed, validated configuration: one frozen dataclass per section of the YAML file.

`configs/opus_books_en_it.yaml` documents every key; the dataclasses below are the single source
of truth for names, types, defaults and allowed ranges.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from .errors import ConfigError


def _spec(default: Any, *, low: float | None = None, high: float | None = None,
          low_open: bool = False, high_open: bool = False, choices: tuple | None = None) -> Any:
    """A dataclass field with its allowed range or choices attached as metadata."""
    meta = {"low": low, "high": high, "low_open": low_open, "high_open": high_open,
            "choices": choices}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class DataConfig:
    source: str = _spec("hub", choices=("hub", "tsv", "jsonl", "parquet", "text"))
    hub_name: str = "Helsinki-NLP/opus_books"
    hub_config: str = "en-it"
    path: Optional[str] = None          # tsv / jsonl / parquet file
    src_path: Optional[str] = None      # text: source side, one sentence per line
    tgt_path: Optional[str] = None      # text: target side, line-aligned with src_path
    src_lang: str = "en"
    tgt_lang: str = "it"
    max_pairs: Optional[int] = _spec(None, low=1)
    max_len: int = _spec(100, low=1)
    long_sentences: str = _spec("filter", choices=("filter", "truncate"))
    valid_size: int = _spec(1000, low=1)
    test_size: int = _spec(1000, low=0)
    seed: int = 1234


@dataclass(frozen=True)
class TokenizerConfig:
    type: str = _spec("word", choices=("word", "bpe"))
    min_frequency: int = _spec(2, low=1)
    max_vocab: Optional[int] = _spec(None, low=8)

    @property
    def joint(self) -> bool:
        """One vocabulary for both languages (BPE), so all embeddings can be one matrix."""
        return self.type == "bpe"


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = _spec(512, low=1)
    layers: int = _spec(6, low=1)
    heads: int = _spec(8, low=1)
    d_ff: int = _spec(2048, low=1)
    dropout: float = _spec(0.1, low=0.0, high=1.0, high_open=True)
    norm: str = _spec("pre", choices=("pre", "post"))
    tie_embeddings: bool = False
    attention: str = _spec("sdpa", choices=("sdpa", "explicit"))


@dataclass(frozen=True)
class TrainConfig:
    device: str = _spec("auto", choices=("auto", "cpu", "cuda", "mps"))
    seed: int = 42
    batch_tokens: int = _spec(4096, low=1)
    accumulate: int = _spec(1, low=1)
    lr: float = _spec(5e-4, low=0.0, low_open=True)
    warmup_steps: int = _spec(4000, low=1)
    adam_betas: tuple = (0.9, 0.98)
    adam_eps: float = _spec(1e-9, low=0.0, low_open=True)
    weight_decay: float = _spec(0.0, low=0.0)
    label_smoothing: float = _spec(0.1, low=0.0, high=1.0, high_open=True)
    clip_norm: float = _spec(1.0, low=0.0)
    max_steps: Optional[int] = _spec(None, low=0)
    max_epochs: int = _spec(100, low=1)
    log_every: int = _spec(50, low=1)
    valid_every: int = _spec(1000, low=1)
    checkpoint_every: int = _spec(1000, low=1)
    keep_last: int = _spec(1, low=1)
    keep_best: int = _spec(1, low=0)
    patience: Optional[int] = _spec(None, low=1)
    max_bad_steps: int = _spec(5, low=1)
    num_workers: int = _spec(0, low=0)
    threads: Optional[int] = _spec(None, low=1)
    recompute: bool = False


@dataclass(frozen=True)
class DecodeConfig:
    max_len_a: float = _spec(1.5, low=0.0)
    max_len_b: int = _spec(10, low=1)
    beam_size: int = _spec(1, low=1)
    length_penalty: float = _spec(0.6, low=0.0)
    valid_sentences: int = _spec(500, low=1)
    batch_size: int = _spec(64, low=1)
    batch_tokens: Optional[int] = _spec(None, low=1)
    max_input_tokens: int = _spec(256, low=1)
    # Sampling instead of greedy search (e.g. for back-translation): 0 = off, else draw each
    # token from the K most probable ones, their probabilities sharpened by 1 / temperature.
    sample_topk: int = _spec(0, low=0)
    temperature: float = _spec(1.0, low=0.0, low_open=True)


@dataclass(frozen=True)
class Config:
    name: str = "run"
    runs_dir: str = "runs"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict:
        return _to_plain(dataclasses.asdict(self))

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)


_SECTION_TYPES = {"data": DataConfig, "tokenizer": TokenizerConfig, "model": ModelConfig,
                  "train": TrainConfig, "decode": DecodeConfig}
_TOP_LEVEL = {"name": str, "runs_dir": str}


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _closest(name: str, valid: list[str]) -> str:
    match = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if match:
        return f"did you mean '{match[0]}'?"
    return "valid keys: " + ", ".join(sorted(valid))


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            tuple: "a list"}.get(tp, str(tp))


def _coerce(where: str, value: Any, annotation: Any, meta: dict) -> Any:
    """Check `value` against the field's annotation and range; return it in the field's type."""
    hints = typing.get_args(annotation) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else ()
    optional = type(None) in hints
    base = next((h for h in hints if h is not type(None)), annotation) if hints else annotation
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: must be {_type_name(base)}, got null")
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if base is tuple and isinstance(value, list):
        value = tuple(value)
    if base is int and isinstance(value, bool) or not isinstance(value, base):
        raise ConfigError(f"{where}: must be {_type_name(base)}, got {value!r}")
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(map(str, choices))}; got {value!r}")
    low, high = meta.get("low"), meta.get("high")
    if low is not None and (value < low or (meta.get("low_open") and value == low)):
        op = ">" if meta.get("low_open") else ">="
        raise ConfigError(f"{where}: must be {op} {low}, got {value!r}")
    if high is not None and (value > high or (meta.get("high_open") and value == high)):
        op = "<" if meta.get("high_open") else "<="
        raise ConfigError(f"{where}: must be {op} {high}, got {value!r}")
    return value


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"section '{name}': must be a mapping of keys to values, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"unknown key '{key}' in section '{name}': "
                              f"{_closest(str(key), list(fields))}")
        values[key] = _coerce(f"{name}.{key}", value, hints[key], dict(fields[key].metadata))
    return cls(**values)


def _check_consistency(cfg: Config) -> None:
    m, d = cfg.model, cfg.data
    if m.d_model % m.heads:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.heads "
                          f"({m.heads})")
    if d.src_lang == d.tgt_lang:
        raise ConfigError(f"data.src_lang and data.tgt_lang are both '{d.src_lang}'")
    needs_path = {"tsv": "path", "jsonl": "path", "parquet": "path"}
    if d.source in needs_path and not d.path:
        raise ConfigError(f"data.path is required when data.source is '{d.source}'")
    if d.source == "text" and not (d.src_path and d.tgt_path):
        raise ConfigError("data.src_path and data.tgt_path are required when data.source is 'text'")
    if cfg.tokenizer.type == "bpe":
        if cfg.tokenizer.max_vocab is None:
            raise ConfigError("tokenizer.max_vocab is required when tokenizer.type is 'bpe': it "
                              "is the size of the joint subword vocabulary, e.g. 8000")
        if not m.tie_embeddings:
            raise ConfigError("tokenizer.type 'bpe' shares one vocabulary between the languages: "
                              "set model.tie_embeddings: true (source, target and output "
                              "embeddings become one matrix)")
    if len(cfg.train.adam_betas) != 2 or not all(0 <= b < 1 for b in cfg.train.adam_betas):
        raise ConfigError(f"train.adam_betas: must be two numbers in [0, 1), "
                          f"got {list(cfg.train.adam_betas)}")


def config_from_dict(raw: Any, source: str = "config") -> Config:
    """Validate a plain mapping (as read from YAML) into a `Config`."""
    if raw is None:
        raise ConfigError(f"{source}: the configuration is empty")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, "
                          f"got {type(raw).__name__}")
    values: dict[str, Any] = {}
    valid = list(_SECTION_TYPES) + list(_TOP_LEVEL)
    for key, value in raw.items():
        if key in _SECTION_TYPES:
            values[key] = _build_section(key, _SECTION_TYPES[key], value)
        elif key in _TOP_LEVEL:
            values[key] = _coerce(key, value, _TOP_LEVEL[key], {})
        else:
            raise ConfigError(f"unknown top-level key '{key}': {_closest(str(key), valid)}")
    cfg = Config(**values)
    _check_consistency(cfg)
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `section.key=value` into its key path and its YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. train.lr=3e-4")
    key, _, raw_value = text.partition("=")
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. train.lr=3e-4")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else None
    except yaml.YAMLError:
        value = raw_value
    # YAML reads 3e-4 as a string (it wants 3.0e-4); users mean a number.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return path, value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {text!r}: '{part}' is not a section")
            node = child
        node[path[-1]] = value
    return raw


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass an existing YAML file with "
                          f"--config, e.g. configs/tiny.yaml)")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}{where}: {problem}; fix the YAML syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a YAML config, apply `--set` overrides, validate and resolve relative data paths."""
    raw = read_yaml(path)
    if raw is None:
        raise ConfigError(f"{path}: the file is empty; see configs/tiny.yaml for an example")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, "
                          f"got {type(raw).__name__}")
    raw = apply_overrides(raw, overrides or [])
    raw.setdefault("name", Path(path).stem)
    cfg = config_from_dict(raw, str(path))
    return resolve_paths(cfg, Path(path).resolve().parent)


def resolve_paths(cfg: Config, base: Path) -> Config:
    """Data paths in a config file are relative to that file, so a config works from any cwd."""
    d = cfg.data
    changes = {}
    for key in ("path", "src_path", "tgt_path"):
        value = getattr(d, key)
        if value and not Path(value).expanduser().is_absolute():
            changes[key] = str((base / value).resolve())
        elif value:
            changes[key] = str(Path(value).expanduser())
    return cfg.replace(data=dataclasses.replace(d, **changes)) if changes else cfg


def save_config(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
