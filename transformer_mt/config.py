"""The typed, validated configuration: one frozen dataclass per section of the YAML file.

The dataclasses below are the single source of truth for names, types, defaults, allowed ranges
and the help text of every key; `documented_yaml()` renders them (`tmt train --print-config`,
and `configs/reference.yaml`, which a test keeps equal to it).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from .errors import ConfigError


def _spec(default: Any, help: str, *, low: float | None = None, high: float | None = None,
          low_open: bool = False, high_open: bool = False, choices: tuple | None = None,
          factory: Any = None) -> Any:
    """A dataclass field with its help text and allowed range or choices attached as metadata
    (as fairseq's dataclass configs do): the documentation lives next to the default."""
    meta = {"help": help, "low": low, "high": high, "low_open": low_open,
            "high_open": high_open, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class DataConfig:
    source: str = _spec("hub", "hub | tsv | jsonl | parquet | text",
                        choices=("hub", "tsv", "jsonl", "parquet", "text"))
    hub_name: str = _spec("Helsinki-NLP/opus_books", "hub dataset (source: hub)")
    hub_config: str = _spec("en-it", "its configuration, i.e. the language pair")
    path: Optional[str] = _spec(None, "tsv / jsonl / parquet file, relative to the config file "
                                "(tsv: 'English<TAB>Italian' per line; jsonl/parquet: "
                                "{\"translation\": {\"en\": ..., \"it\": ...}} or en/it columns)")
    src_path: Optional[str] = _spec(None, "source: text: source sentences, one per line")
    tgt_path: Optional[str] = _spec(None, "source: text: target sentences, line-aligned with "
                                    "src_path")
    src_lang: str = _spec("en", "source language code (key in the translation column)")
    tgt_lang: str = _spec("it", "target language code")
    max_pairs: Optional[int] = _spec(None, "keep a seeded random sample of this many pairs "
                                     "(null: all)", low=1)
    max_len: int = _spec(100, "longest sentence, in tokens (words, punctuation marks), either "
                         "side", low=1)
    long_sentences: str = _spec("filter", "filter: drop longer pairs | truncate: cut them to "
                                "max_len tokens", choices=("filter", "truncate"))
    valid_size: int = _spec(1000, "distinct source sentences held out for validation (at least: "
                            "whole groups of pairs that share a source or target sentence)",
                            low=1)
    test_size: int = _spec(1000, "the same, held out for testing (tmt evaluate)", low=0)
    seed: int = _spec(1234, "seed of the split (no source or target sentence in two splits)")
    copy_augment: float = _spec(0.0, "share of the train pairs with a capitalised word carried "
                                "across unchanged (a name) that are added again with that word "
                                "replaced on both sides by an invented name: teaches a subword "
                                "model to copy names it never saw (0: off)", low=0.0, high=1.0)


@dataclass(frozen=True)
class TokenizerConfig:
    type: str = _spec("word", "word: a word-level vocabulary per language, trained on the train "
                      "split | bpe: one joint subword (BPE) vocabulary for both languages, "
                      "trained on both sides of the train split; needs model.tie_embeddings: "
                      "true | unigram: as bpe, with a unigram language model of subwords",
                      choices=("word", "bpe", "unigram"))
    min_frequency: int = _spec(2, "word: rarer words become [UNK]; bpe: rarer merges are not "
                               "learnt; unigram: not used", low=1)
    max_vocab: Optional[int] = _spec(None, "word: cap on each vocabulary, most frequent first "
                                     "(null: no cap); bpe, unigram: the joint vocabulary size "
                                     "(required, e.g. 8000)", low=8)
    sample_pairs: Optional[int] = _spec(None, "train the tokenizers on a seeded random sample of "
                                        "this many train pairs (faster on corpora of millions; "
                                        "null: all of them)", low=1)

    @property
    def joint(self) -> bool:
        """One vocabulary for both languages (subwords: BPE or unigram), so all embeddings can
        be one matrix."""
        return self.type in ("bpe", "unigram")


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = _spec(512, "width of embeddings and of every layer", low=1)
    layers: int = _spec(6, "encoder blocks, and as many decoder blocks", low=1)
    heads: int = _spec(8, "attention heads (d_model must be divisible by heads)", low=1)
    d_ff: int = _spec(2048, "inner width of the position-wise feed-forward layers", low=1)
    dropout: float = _spec(0.1, "dropout on embeddings, sub-layer outputs, attention and FFN",
                           low=0.0, high=1.0, high_open=True)
    norm: str = _spec("pre", "pre: x + f(norm(x)) (stable) | post: norm(x + f(x)) (as in the "
                      "paper)", choices=("pre", "post"))
    tie_embeddings: bool = _spec(False, "share the target embedding matrix with the output "
                                 "projection (with tokenizer.type bpe, the source embedding too)")
    attention: str = _spec("sdpa", "sdpa: torch's fused scaled_dot_product_attention | explicit: "
                           "softmax(QK^T/sqrt(d))V", choices=("sdpa", "explicit"))


@dataclass(frozen=True)
class TrainConfig:
    device: str = _spec("auto", "auto (cuda -> mps -> cpu) | cpu | cuda | mps; bf16 autocast on "
                        "cuda", choices=("auto", "cpu", "cuda", "mps"))
    seed: int = _spec(42, "seeds parameters, dropout and the batch order")
    batch_tokens: int = _spec(4096, "padded positions per batch (src or tgt side, whichever is "
                              "longer)", low=1)
    accumulate: int = _spec(1, "batches per optimizer step (gradient accumulation)", low=1)
    lr: float = _spec(5e-4, "peak learning rate, reached at the end of warm-up (Noam schedule)",
                      low=0.0, low_open=True)
    warmup_steps: int = _spec(4000, "linear warm-up steps; afterwards lr decays as 1/sqrt(step)",
                              low=1)
    adam_betas: tuple = _spec((0.9, 0.98), "Adam beta1, beta2")
    adam_eps: float = _spec(1e-9, "Adam epsilon", low=0.0, low_open=True)
    weight_decay: float = _spec(0.0, "L2 weight decay", low=0.0)
    label_smoothing: float = _spec(0.1, "label smoothing of the cross-entropy (padding is "
                                   "ignored)", low=0.0, high=1.0, high_open=True)
    clip_norm: float = _spec(1.0, "clip the gradient norm to this (0: no clipping)", low=0.0)
    max_steps: Optional[int] = _spec(None, "stop after this many optimizer steps in all (null: "
                                     "use max_epochs)", low=0)
    max_epochs: int = _spec(100, "stop after this many passes over the train split", low=1)
    decay_steps: Optional[int] = _spec(None, "decay the learning rate linearly to zero over the "
                                       "last N steps before train.max_steps (warm-up, stable, "
                                       "decay); null: none (needs train.max_steps)", low=1)
    log_every: int = _spec(50, "steps between progress lines in train.log and TensorBoard "
                           "train/* scalars", low=1)
    valid_every: int = _spec(1000, "steps between validations (loss, BLEU, chrF, samples) and "
                             "checkpoints", low=1)
    checkpoint_every: int = _spec(1000, "steps between checkpoints (besides those at "
                                  "validation)", low=1)
    keep_last: int = _spec(1, "newest step checkpoints kept (checkpoints/stepNNNNNNNN.pt), "
                           "besides last.pt/best.pt", low=1)
    best_metric: str = _spec("loss", "what best.pt, train.keep_best, train.patience and tmt "
                             "average --best rank validations by: loss (lower is better; "
                             "smooth even on a few hundred sentences) or bleu (greedy BLEU on "
                             "decode.valid_sentences, noisier)", choices=("loss", "bleu"))
    keep_best: int = _spec(1, "step checkpoints with the best validation score "
                           "(train.best_metric) also kept (for tmt average --best)", low=0)
    patience: Optional[int] = _spec(None, "stop after this many validations without a better "
                                    "score (train.best_metric) (null: never)", low=1)
    max_bad_steps: int = _spec(5, "stop after this many consecutive steps with a non-finite "
                               "loss or gradient", low=1)
    num_workers: int = _spec(0, "DataLoader worker processes (0: load in the training process)",
                             low=0)
    threads: Optional[int] = _spec(None, "torch CPU threads (null: torch's default, one per "
                                   "core)", low=1)
    init_from: Optional[str] = _spec(None, "fine-tune: start from the weights of this checkpoint "
                                     "(relative to the config file) with a new optimizer and "
                                     "schedule, and its tokenizers instead of new ones; model "
                                     "and tokenizer sections as it was trained (null: random "
                                     "start)")
    recompute: bool = _spec(False, "recompute each layer's activations in the backward pass "
                            "instead of keeping them: ~1/3 less memory at base size for ~1/4 "
                            "more compute")


@dataclass(frozen=True)
class DecodeConfig:
    max_len_a: float = _spec(1.5, "output at most max_len_a * source length + max_len_b tokens",
                             low=0.0)
    max_len_b: int = _spec(10, "see max_len_a", low=1)
    beam_size: int = _spec(1, "1: greedy search; >1: beam search (validation and tmt translate)",
                           low=1)
    length_penalty: float = _spec(0.6, "beam search length penalty alpha: scores are divided by "
                                  "((5+len)/6)^alpha", low=0.0)
    valid_sentences: int = _spec(500, "validation sentences translated for BLEU / chrF", low=1)
    batch_size: int = _spec(64, "sentences decoded together", low=1)
    batch_tokens: Optional[int] = _spec(None, "also cap a decoding batch at this many padded "
                                        "source tokens (null: no cap)", low=1)
    max_input_tokens: int = _spec(256, "longer inputs to tmt translate are truncated, with a "
                                  "warning", low=1)
    sample_topk: int = _spec(0, ">0: sample each token from the k most probable instead of greedy "
                             "search (e.g. for back-translation; beam 1 only); 0: off", low=0)
    temperature: float = _spec(1.0, "sampling temperature: softmax(logits / t); lower: nearer "
                               "greedy", low=0.0, low_open=True)
    replace_unk: Optional[bool] = _spec(None, "write each [UNK] of an output as the source word it "
                                        "attends to most (null: on for word-level target "
                                        "vocabularies, off for subword ones)")


@dataclass(frozen=True)
class Config:
    name: str = _spec("run", "run name: the run goes to <runs_dir>/<name> unless --run-dir is "
                      "given (default: the config file's name)")
    runs_dir: str = _spec("runs", "parent folder of all runs (relative to where tmt is started)")
    data: DataConfig = _spec(None, "the corpus, its cleaning and its split", factory=DataConfig)
    tokenizer: TokenizerConfig = _spec(None, "vocabularies, trained on the train split only",
                                       factory=TokenizerConfig)
    model: ModelConfig = _spec(None, "the Transformer's shape", factory=ModelConfig)
    train: TrainConfig = _spec(None, "optimisation, validation, checkpoints",
                               factory=TrainConfig)
    decode: DecodeConfig = _spec(None, "greedy / beam search", factory=DecodeConfig)

    def to_dict(self) -> dict:
        return _to_plain(dataclasses.asdict(self))

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)


_SECTION_TYPES = {"data": DataConfig, "tokenizer": TokenizerConfig, "model": ModelConfig,
                  "train": TrainConfig, "decode": DecodeConfig}
_TOP_LEVEL = {"name": str, "runs_dir": str}
HELP_COLUMN = 28       # where the help comments start in documented YAML
LINE_WIDTH = 100


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


def _is_finite(value: Any) -> bool:
    """False for float nan/inf and for strings that Python reads as them ("nan", "-Infinity")."""
    try:
        return math.isfinite(float(value)) if isinstance(value, (float, str)) else True
    except ValueError:
        return True     # not a number at all: the type check reports it


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
    if base is float and not _is_finite(value):
        # nan passes every range check (all comparisons with it are false) and inf would
        # overflow later: refuse both here, whether YAML (.nan, .inf) or --set (nan, 1e999).
        raise ConfigError(f"{where}: must be a finite number, got {value!r}")
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
    # The run goes to runs_dir/name: a path in `name` could point it anywhere.
    if cfg.name.strip() in ("", ".", "..") or any(c in cfg.name for c in "/\\\0"):
        raise ConfigError(f"name: must be a plain folder name (the run goes to "
                          f"{cfg.runs_dir}/<name>; use --run-dir for another place), got "
                          f"{cfg.name!r}")
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
    if cfg.tokenizer.joint:
        kind = cfg.tokenizer.type
        if cfg.tokenizer.max_vocab is None:
            raise ConfigError(f"tokenizer.max_vocab is required when tokenizer.type is '{kind}': "
                              f"it is the size of the joint subword vocabulary, e.g. 8000")
        if not m.tie_embeddings:
            raise ConfigError(f"tokenizer.type '{kind}' shares one vocabulary between the "
                              "languages: set model.tie_embeddings: true (source, target and "
                              "output embeddings become one matrix)")
    if cfg.train.decay_steps is not None and cfg.train.max_steps is None:
        raise ConfigError(f"train.decay_steps ({cfg.train.decay_steps}) needs train.max_steps: "
                          "the decay ends there")
    betas = cfg.train.adam_betas
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                  and 0 <= b < 1 for b in betas):
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
    """Paths in a config file (data, train.init_from) are relative to that file, so a config
    works from any cwd."""
    d = cfg.data
    changes = {}
    for key in ("path", "src_path", "tgt_path"):
        value = getattr(d, key)
        if value and not Path(value).expanduser().is_absolute():
            changes[key] = str((base / value).resolve())
        elif value:
            changes[key] = str(Path(value).expanduser())
    if changes:
        cfg = cfg.replace(data=dataclasses.replace(d, **changes))
    init_from = cfg.train.init_from
    if init_from and not Path(init_from).expanduser().is_absolute():
        cfg = cfg.replace(train=dataclasses.replace(cfg.train,
                                                    init_from=str((base / init_from).resolve())))
    return cfg


def save_config(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")


def _yaml_scalar(value: Any) -> str:
    # flow style keeps lists on one line; the first line drops YAML's "..." end-of-document mark
    return yaml.safe_dump(value, default_flow_style=True, width=1000).splitlines()[0]


def _comment_lines(help_text: str, indent: int) -> list[str]:
    width = LINE_WIDTH - indent - 2
    words, lines, line = help_text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line] if line else lines


def _documented_fields(fields: list[dataclasses.Field], values: dict, indent: str) -> list[str]:
    out = []
    for f in fields:
        entry = f"{indent}{f.name}: {_yaml_scalar(values[f.name])}"
        column = max(HELP_COLUMN, len(entry) + 1)
        comments = _comment_lines(f.metadata["help"], column)
        out.append(f"{entry.ljust(column)}# {comments[0]}")
        out.extend(f"{' ' * column}# {more}" for more in comments[1:])
    return out


def documented_yaml(cfg: Config | None = None) -> str:
    """`cfg` (default: all defaults) as YAML with every key's meaning beside it."""
    cfg = cfg or Config()
    values = cfg.to_dict()
    lines = ["# tmt configuration: every key, its value and its meaning (tmt train --print-config).",
             "# A config file lists only what it changes; its paths (data, train.init_from) are "
             "relative to the file.",
             "# Override any key on the command line: tmt train --config FILE --set train.lr=3e-4",
             ""]
    top_fields = {f.name: f for f in dataclasses.fields(Config)}
    lines += _documented_fields([top_fields[name] for name in _TOP_LEVEL], values, "")
    for name, cls in _SECTION_TYPES.items():
        lines += ["", f"{name}:".ljust(HELP_COLUMN) + f"# {top_fields[name].metadata['help']}"]
        lines += _documented_fields(dataclasses.fields(cls), values[name], "  ")
    return "\n".join(lines) + "\n"
