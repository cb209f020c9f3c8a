"""The `tmt` command: argument parsing and wiring only; the work happens in the modules it calls."""

from __future__ import annotations

import argparse
import itertools
import logging
import random
import sys
from pathlib import Path
from typing import Iterable, Iterator

from .errors import TmtError
from .openmp import configure_openmp

log = logging.getLogger("transformer_mt")

STDIN_CHUNK = 256     # lines translated together when streaming from stdin


class _TqdmHandler(logging.Handler):
    """Log lines printed through tqdm so that they do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm
        tqdm.write(self.format(record), file=sys.stderr)


def setup_logging(level: int = logging.INFO, log_file: Path | None = None) -> None:
    log.handlers.clear()
    log.setLevel(logging.INFO)
    console = _TqdmHandler()
    console.setLevel(level)
    console.setFormatter(logging.Formatter("tmt: %(message)s"))
    log.addHandler(console)
    if log_file is not None:
        handler = logging.FileHandler(log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
    log.propagate = False


# --------------------------------------------------------------------------- train

def _load_train_config(args: argparse.Namespace):
    from .config import load_config
    from .run import RunDir

    overrides = list(args.set or [])
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.device:
        overrides.append(f"train.device={args.device}")
    if args.config:
        cfg = load_config(args.config, overrides)
    elif args.resume and args.run_dir:
        cfg = load_config(Path(args.run_dir) / "config.yaml", overrides)
    else:
        raise TmtError("pass --config FILE (or --resume with --run-dir DIR to continue a run "
                       "with its saved config)")
    run = RunDir(Path(args.run_dir) if args.run_dir else Path(cfg.runs_dir) / cfg.name)
    return cfg, run


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from .checkpoint import load_checkpoint
    from .config import save_config
    from .device import pick_device
    from .model import build_model, count_parameters
    from .resume import check_resume_config
    from .run import load_data, prepare_data
    from .training import Trainer

    cfg, run = _load_train_config(args)
    state = None
    if args.resume:
        if not run.last.is_file():
            raise TmtError(f"nothing to resume: no checkpoint {run.last}; start the run without "
                           f"--resume")
        state = load_checkpoint(run.last)
        cfg = check_resume_config(cfg, state, log)
        max_steps = cfg.train.max_steps
        if max_steps is not None and state["step"] >= max_steps:
            print(f"tmt: {run.path} already reached step {state['step']} (train.max_steps="
                  f"{max_steps}); pass a larger --max-steps to continue", file=sys.stderr)
            return 0
    elif run.last.is_file():
        raise TmtError(f"{run.path} already holds a run (checkpoints/last.pt); pass --resume to "
                       f"continue it or --run-dir NEW_DIR to start another")
    run.ensure_writable()
    setup_logging(log_file=run.path / "train.log")
    save_config(cfg, run.config)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = pick_device(cfg.train.device)
    _seed_everything(cfg.train.seed)
    prepare_data(cfg, run)
    data = load_data(run)
    model = build_model(cfg.model, data.src_codec.vocab_size, data.tgt_codec.vocab_size)
    model.to(device)
    trainer = Trainer(cfg, run, data, model, device)
    if state is not None:
        trainer.load_state_dict(state)
        log.info("resumed %s at step %d (epoch %d)", run.path, trainer.step, trainer.epoch)
    log.info("model: %s parameters, d_model %d, %d layers, vocab %d/%d; device %s; run %s",
             f"{count_parameters(model):,}", cfg.model.d_model, cfg.model.layers,
             data.src_codec.vocab_size, data.tgt_codec.vocab_size, device, run.path)
    return trainer.train()


# --------------------------------------------------------------------------- translate

def _checkpoint_path(args: argparse.Namespace) -> Path:
    from .checkpoint import BEST, LAST
    from .run import latest_run

    if args.checkpoint:
        return Path(args.checkpoint)
    run_path = Path(args.run) if args.run else latest_run(Path(args.runs_dir))
    if run_path is None:
        raise TmtError(f"no trained run found under {args.runs_dir}/; train one first (tmt train "
                       f"--config configs/tiny.yaml) or pass --run DIR / --checkpoint FILE")
    for name in (BEST, LAST):
        if (run_path / "checkpoints" / name).is_file():
            return run_path / "checkpoints" / name
    raise TmtError(f"{run_path} has no checkpoint (checkpoints/best.pt or last.pt); train it first")


def _input_lines(sentences: list[str]) -> Iterator[str]:
    if sentences:
        yield from sentences
        return
    for line in sys.stdin:
        yield line.rstrip("\r\n")


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    lines = iter(lines)
    while chunk := list(itertools.islice(lines, size)):
        yield chunk


def cmd_translate(args: argparse.Namespace) -> int:
    from .translator import Translator

    setup_logging(logging.WARNING)
    translator = Translator.from_checkpoint(_checkpoint_path(args), args.device)
    for chunk in _chunks(_input_lines(args.sentences), STDIN_CHUNK):
        for line in translator.translate(chunk, beam_size=args.beam):
            print(line)
        sys.stdout.flush()
    return 0


# --------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmt", description="Train and use an English-Italian "
                                     "translation Transformer.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model from a YAML config")
    train.add_argument("--config", help="YAML config, e.g. configs/tatoeba_en_it.yaml")
    train.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                       help="override a config value (repeatable), e.g. --set train.lr=3e-4")
    train.add_argument("--run-dir", help="where the run's files go (default: runs/<config name>)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run from its checkpoints/last.pt")
    train.add_argument("--max-steps", type=int, help="stop after this many optimizer steps in all "
                       "(absolute, counting the steps before a resume)")
    train.add_argument("--device", choices=("auto", "cpu", "cuda", "mps"))
    train.set_defaults(func=cmd_train)

    translate = commands.add_parser("translate", help="translate sentences (arguments or stdin)")
    translate.add_argument("sentences", nargs="*", help="sentences; none: read lines from stdin")
    where = translate.add_mutually_exclusive_group()
    where.add_argument("--run", help="run directory (default: the latest run under --runs-dir)")
    where.add_argument("--checkpoint", help="checkpoint file to translate with")
    translate.add_argument("--runs-dir", default="runs", help="where to look for the latest run")
    translate.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    translate.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "mps"))
    translate.set_defaults(func=cmd_translate)
    return parser


def main(argv: list[str] | None = None) -> int:
    configure_openmp()              # before the commands import torch
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TmtError as exc:
        print(f"tmt: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tmt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `tmt translate ... | head -1`): nothing left to do.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
