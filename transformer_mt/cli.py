"""The `tmt` command: argument parsing and wiring only; the work happens in the modules it calls."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Iterator

from . import __version__
from .allocator import reexec_with_tcmalloc
from .errors import TmtError
from .logs import setup_logging
from .openmp import configure_openmp
from .paths import STDIO, refuse_overwriting_inputs, refuse_overwriting_with_hypotheses
from .textio import chunks, utf8_lines

STDIN_CHUNK = 256     # lines translated together when streaming from stdin


# --------------------------------------------------------------------------- train

def _load_train_config(args: argparse.Namespace):
    # Only the light config module first: a mistake in the config is reported before torch and
    # datasets are imported (seconds sooner).
    from .config import load_config

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
    from .rundir import RunDir
    run = RunDir(Path(args.run_dir) if args.run_dir else Path(cfg.runs_dir) / cfg.name)
    return cfg, run


def _print_config(args: argparse.Namespace) -> int:
    """Every key with its meaning: the defaults, or the resolved --config (with --set)."""
    from .config import apply_overrides, config_from_dict, documented_yaml, load_config

    overrides = list(args.set or [])
    if args.config:
        cfg = load_config(args.config, overrides)
    else:
        cfg = config_from_dict(apply_overrides({"name": "run"}, overrides))
    print(documented_yaml(cfg), end="")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    if args.print_config:
        return _print_config(args)
    cfg, run = _load_train_config(args)
    if os.environ.get("RANK", "0") == "0":
        from .rundir import check_can_train

        # The folder refusals, before torch's seconds of imports; checked again under the lock.
        check_can_train(cfg, run, args.resume)
    from .training import run_training

    return run_training(cfg, run, args.resume)


# --------------------------------------------------------------------------- translate

def _load_model(args: argparse.Namespace):
    """The model `--run/--checkpoint` or `--model` name, with the decoding options of the command
    line applied over the run's decode settings; says on stderr which model it is."""
    if (args.beam is not None and args.beam < 1) or (args.batch_tokens is not None
                                                     and args.batch_tokens < 1):
        raise TmtError("--beam and --batch-tokens must be at least 1")
    sampling = args.sample_topk is not None and args.sample_topk > 0
    if sampling and ((args.beam or 1) > 1 or getattr(args, "nbest", 1) > 1):
        raise TmtError("--sample-topk samples one translation per sentence: it cannot be "
                       "combined with --beam K > 1 or --nbest N > 1")
    changes = _decode_changes(args)        # checked before torch is imported: a quick error
    if sampling:
        changes["beam_size"] = 1
    from .loading import load_model

    loaded = load_model(args.checkpoint, args.run, args.runs_dir, args.model, args.device,
                        **changes)
    if args.seed is not None:
        loaded.translator = loaded.translator.with_decoding(seed=args.seed)
    print(f"tmt: using {loaded.describe()}", file=sys.stderr)
    return loaded


def _checkpoint_path(args: argparse.Namespace) -> Path | None:
    """The checkpoint file that --run/--checkpoint name (None for --model), found without
    loading it; errors as loading would give them."""
    if args.model is not None:
        return None
    from .rundir import find_checkpoint

    return find_checkpoint(args.checkpoint, Path(args.run) if args.run else None,
                           Path(args.runs_dir))


def _decode_changes(args: argparse.Namespace) -> dict:
    """The decode settings given on the command line, checked as the config file's are."""
    from .config import config_from_dict

    options = {"beam_size": args.beam, "batch_tokens": args.batch_tokens,
               "length_penalty": args.length_penalty, "max_len_a": args.max_len_a,
               "max_len_b": args.max_len_b, "sample_topk": args.sample_topk,
               "temperature": args.temperature, "replace_unk": args.replace_unk}
    changes = {name: value for name, value in options.items() if value is not None}
    checked = config_from_dict({"decode": changes}, "the command line").decode
    return {name: getattr(checked, name) for name in changes}


def _input_lines(sentences: list[str], input_file: str | None) -> Iterator[str]:
    """The sentences given as arguments, else the lines of --input FILE or of stdin (`-`), read
    lazily so that a large file is never held in memory at once. Bytes that are not UTF-8 stop
    the command with the line's number."""
    if sentences:
        yield from sentences
        return
    if input_file and input_file != STDIO:
        try:
            handle, name = open(input_file, "rb"), input_file
        except OSError as exc:
            raise TmtError(f"cannot read --input {input_file}: {exc.strerror}") from None
    else:
        handle, name = sys.stdin.buffer, "stdin"
    with handle:
        yield from utf8_lines(handle, name)


def _open_output(path: str | None):
    if not path or path == STDIO:
        return contextlib.nullcontext(sys.stdout)
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise TmtError(f"cannot write --output {path}: {exc.strerror}") from None


def _prompted_lines() -> Iterator[str]:
    """Lines typed at a terminal, each read after a prompt on stderr (as fairseq-interactive
    does), so that stdout carries only translations."""
    print("tmt: type a sentence and press Enter; Ctrl-D quits", file=sys.stderr)
    while True:
        print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line.rstrip("\r\n")


def cmd_translate(args: argparse.Namespace) -> int:
    setup_logging(logging.WARNING)
    if args.nbest < 1:
        raise TmtError("--nbest must be at least 1")
    if args.attention and len(args.sentences) != 1:
        raise TmtError("--attention FILE.png draws one sentence: pass exactly one sentence "
                       "argument")
    if args.attention and args.model:
        raise TmtError("--attention needs the PyTorch model: pass --run/--checkpoint, not "
                       "--model")
    if args.sentences and args.input:
        raise TmtError("pass sentences as arguments or --input FILE, not both")
    # Pipes are fine (--input <(zcat x.gz)); folders and missing paths are not.
    if args.input and args.input != STDIO and (Path(args.input).is_dir()
                                               or not Path(args.input).exists()):
        problem = "is a directory" if Path(args.input).is_dir() else "file not found"
        raise TmtError(f"--input {args.input}: {problem}; pass a text file, or - for stdin")
    # Before anything is loaded (torch included: a quick error), and long before an output
    # file is opened; checked again against the checkpoint that was loaded.
    checkpoint = _checkpoint_path(args)
    refuse_overwriting_inputs(args.output, [("--input", args.input),
                                            ("the checkpoint", checkpoint)])
    refuse_overwriting_inputs(args.attention, [("--input", args.input), ("--output", args.output),
                                               ("the checkpoint", checkpoint)], "--attention")
    loaded = _load_model(args)
    for output, option in ((args.output, "--output"), (args.attention, "--attention")):
        refuse_overwriting_inputs(output, [("the checkpoint", loaded.weights)], option)
    translator = loaded.translator
    interactive = not args.sentences and not args.input and sys.stdin.isatty()
    lines = _prompted_lines() if interactive else _input_lines(args.sentences, args.input)
    with _open_output(args.output) as out:
        index = 0
        for chunk in chunks(lines, 1 if interactive else STDIN_CHUNK):
            if args.nbest > 1:
                # Moses n-best format: input line number (from 0) ||| translation ||| score.
                for hyps in translator.translate_nbest(chunk, args.nbest):
                    for text, score in hyps:
                        print(f"{index} ||| {text} ||| {score:.4f}", file=out)
                    index += 1
            else:
                for line in translator.translate(chunk):
                    print(line, file=out)
            out.flush()
    if args.attention:
        from .attention_plot import cross_attention, save_attention_plot

        alignment = cross_attention(translator, args.sentences[0])
        save_attention_plot(alignment, Path(args.attention))
    return 0


# --------------------------------------------------------------------------- evaluate

def cmd_evaluate(args: argparse.Namespace) -> int:
    setup_logging(logging.WARNING)
    if bool(args.src) != bool(args.ref):
        raise TmtError("pass both --src FILE and --ref FILE (line-aligned), or neither to "
                       "evaluate on the run's test split")
    if args.src and args.split:
        raise TmtError("pass either --split (one of the run's splits) or --src/--ref files, "
                       "not both")
    if args.unseen and (args.src or args.split == "valid"):
        raise TmtError("--unseen builds its sets from the run's test split: use it without "
                       "--src/--ref and --split valid")
    # Refusals that need no model come before torch is imported: a quick error.
    inputs = [("--src", args.src), ("--ref", args.ref), ("the checkpoint", _checkpoint_path(args))]
    if args.output:
        refuse_overwriting_with_hypotheses(Path(args.output), inputs)
    from .evaluate import default_output, evaluate, file_test_set, run_held_out_set, write_outputs

    if args.src:
        test = file_test_set(Path(args.src), Path(args.ref))
    loaded = _load_model(args)
    beam = loaded.translator.decode_cfg.beam_size
    run = loaded.run
    if not args.src:
        if run is None:
            raise TmtError(f"{loaded.weights} is not inside a run directory: pass --run DIR for "
                           f"its test split, or --src FILE --ref FILE")
        test = run_held_out_set(run, args.split or "test")
    hyp_path = Path(args.output) if args.output else default_output(loaded.weights, test, beam)
    refuse_overwriting_with_hypotheses(hyp_path, inputs[:2] + [("the checkpoint",
                                                                loaded.weights)])
    hypotheses, report = evaluate(loaded.translator, test, loaded.weights)
    if args.unseen:
        report["unseen"] = _evaluate_unseen(run, loaded.translator, loaded.weights)
    json_path = write_outputs(hypotheses, report, hyp_path)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['bleu_details']}\n  {report['signature']}")
        print(f"chrF2 = {report['chrf']:.2f}\n  {report['chrf_signature']}")
        print(f"{report['sentences']} sentences ({report['translated']} distinct sources) in "
              f"{report['seconds']:.1f} s, {report['sentences_per_s']:.1f} sentences/s, beam "
              f"{beam}, {loaded.weights}")
        for name, scores in report.get("unseen", {}).items():
            copied = scores.get("names_copied")
            print(f"{name}: BLEU {scores['bleu']:.2f}, chrF2 {scores['chrf']:.2f} on "
                  f"{scores['sentences']} sentences ({scores['translated']} distinct sources)"
                  + (f"; {copied:.1%} of the new names written as they are" if copied is not None
                     else ""))
        print(f"hypotheses: {hyp_path}\nreport: {json_path}")
    return 0


def _evaluate_unseen(run, translator, checkpoint: Path) -> dict:
    """Scores on the run's unseen-words sets (`transformer_mt/unseen.py`), keyed by set name."""
    from .evaluate import default_output, evaluate, write_outputs
    from .names import names_copied
    from .unseen import unseen_sets

    results = {}
    for unseen in unseen_sets(run):
        if not unseen.sources:
            results[unseen.name] = {"bleu": 0.0, "chrf": 0.0, "sentences": 0, "translated": 0}
            continue
        hypotheses, report = evaluate(translator, unseen, checkpoint)
        write_outputs(hypotheses, report,
                      default_output(checkpoint, unseen, translator.decode_cfg.beam_size))
        results[unseen.name] = {key: report[key] for key in (
            "bleu", "chrf", "sentences", "translated", "unknown_source_tokens",
            "outputs_with_unk", "hypotheses")}
        if unseen.name == "names":
            copied = names_copied(unseen.sources, hypotheses)
            results["names"]["names_copied"] = None if copied is None else round(copied, 4)
    return results


# --------------------------------------------------------------------------- info, average

def cmd_info(args: argparse.Namespace) -> int:
    from .info import run_info
    from .rundir import latest_run

    setup_logging(logging.WARNING)
    run = Path(args.run) if args.run else latest_run(Path(args.runs_dir))
    if run is None:
        raise TmtError(f"no trained run found under {args.runs_dir}/; pass --run DIR")
    info = run_info(run)
    text = info.pop("text")
    print(json.dumps(info, indent=2) if args.json else text)
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from .average import average_files, average_run_checkpoints

    setup_logging()
    if args.files and (args.run or args.last is not None or args.best is not None):
        raise TmtError("pass checkpoint files, or --run DIR with --last K / --best K, not both")
    if args.files:
        if not args.output:
            raise TmtError("averaging given files needs --output FILE")
        output = average_files([Path(f) for f in args.files], Path(args.output))
    else:
        if not args.run:
            raise TmtError("pass --run DIR (with --last K or --best K) or checkpoint files")
        output = average_run_checkpoints(Path(args.run), args.last, args.best,
                                         Path(args.output) if args.output else None)
    print(output)
    return 0


# --------------------------------------------------------------------------- serve, export

def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .serve import ServeLimits, serve
    except ImportError as exc:           # FastAPI, uvicorn or one of their own dependencies
        raise TmtError(f"tmt serve cannot load its web server ({exc}): reinstall it with "
                       "pip install fastapi uvicorn") from None

    setup_logging(logging.WARNING)
    if min(args.max_sentences, args.max_chars, args.max_batch_sentences) < 1 or \
            not 0 <= args.batch_wait_ms <= 10_000:
        raise TmtError("--max-sentences, --max-chars and --max-batch-sentences must be at "
                       "least 1, --batch-wait-ms between 0 and 10000")
    if not 0 <= args.port <= 65535:
        raise TmtError(f"--port must be between 0 and 65535, got {args.port}")
    limits = ServeLimits(args.max_sentences, args.max_chars, args.batch_wait_ms,
                         args.max_batch_sentences)
    loaded = _load_model(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"tmt: warning: --host {args.host} lets other machines reach this server; tmt "
              f"serve has no authentication", file=sys.stderr)
    serve(loaded, args.host, args.port, limits, args.access_log)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_model
    from .rundir import find_checkpoint

    setup_logging(logging.WARNING)
    checkpoint = find_checkpoint(args.checkpoint, Path(args.run) if args.run else None,
                                 Path(args.runs_dir))
    output = export_model(checkpoint, Path(args.output), args.format, args.quantization)
    print(output)
    return 0


# --------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmt", description="Train and use an English-Italian "
                                     "translation Transformer.")
    parser.add_argument("--version", action="version", version=f"tmt {__version__}")
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
    train.add_argument("--print-config", action="store_true", help="print every config key with "
                       "its value and meaning (the defaults, or --config FILE resolved) and exit")
    train.set_defaults(func=cmd_train)

    translate = commands.add_parser("translate", help="translate sentences (arguments, --input "
                                    "FILE or stdin)")
    translate.add_argument("sentences", nargs="*", help="sentences; none: read lines from "
                           "--input FILE or stdin, streamed")
    _add_model_options(translate)
    translate.add_argument("--nbest", type=int, default=1, metavar="N",
                           help="N > 1: print up to N distinct translations per input as "
                           "'LINE ||| translation ||| score' (beam search with a beam of at "
                           "least N)")
    translate.add_argument("--input", metavar="FILE", help="translate the lines of FILE")
    translate.add_argument("--output", metavar="FILE", help="write translations to FILE "
                           "(default: stdout)")
    translate.add_argument("--attention", metavar="FILE.png", help="also draw the cross-"
                           "attention of the (single) sentence's translation to FILE.png")
    translate.set_defaults(func=cmd_translate)

    evaluate = commands.add_parser("evaluate", help="BLEU and chrF (sacreBLEU) on the run's "
                                   "test split or on --src/--ref files")
    _add_model_options(evaluate)
    evaluate.add_argument("--split", choices=("test", "valid"), help="the run's split to "
                          "score (default: test); choose checkpoints and decoding settings on "
                          "valid, then score test once")
    evaluate.add_argument("--src", metavar="FILE", help="source sentences, one per line")
    evaluate.add_argument("--ref", metavar="FILE", help="reference translations, line-aligned "
                          "with --src")
    evaluate.add_argument("--output", metavar="FILE", help="hypotheses file (default: "
                          "<run>/eval/<test set>.<checkpoint>.beam<K>.hyp); the JSON report is "
                          "written beside it with the suffix .json")
    evaluate.add_argument("--json", action="store_true", help="print the report as one JSON "
                          "object on stdout")
    evaluate.add_argument("--unseen", action="store_true", help="also score the run's "
                          "unseen-words sets, built from its test split: pairs with a word rare "
                          "in training, and pairs with names swapped for unseen ones")
    evaluate.set_defaults(func=cmd_evaluate)

    info = commands.add_parser("info", help="a run's config, model size, steps, best scores and "
                               "checkpoints")
    info.add_argument("--run", help="run directory (default: the latest run under --runs-dir)")
    info.add_argument("--runs-dir", default="runs", help="where to look for the latest run")
    info.add_argument("--json", action="store_true", help="print the facts as one JSON object")
    info.set_defaults(func=cmd_info)

    average = commands.add_parser("average", help="average the weights of several checkpoints "
                                  "into one")
    average.add_argument("files", nargs="*", help="checkpoint files to average (instead of --run)")
    average.add_argument("--run", help="run directory whose step checkpoints to average")
    which = average.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, metavar="K", help="the newest K step checkpoints "
                       "(default: all kept ones)")
    which.add_argument("--best", type=int, metavar="K", help="the K step checkpoints with the "
                       "best validation scores (by the run's train.best_metric)")
    average.add_argument("--output", metavar="FILE", help="where to write the average (default: "
                         "<run>/checkpoints/average_last<K>.pt or average_best<K>.pt)")
    average.set_defaults(func=cmd_average)

    serve = commands.add_parser("serve", help="serve the model over HTTP: a JSON API with "
                                "dynamic batching and a web page")
    _add_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: "
                       "loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="port (0: any free port; the "
                       "address is printed on stderr)")
    serve.add_argument("--max-sentences", type=int, default=64, metavar="N",
                       help="sentences per request (more: 413)")
    serve.add_argument("--max-chars", type=int, default=20_000, metavar="N",
                       help="characters per request (more: 413)")
    serve.add_argument("--batch-wait-ms", type=float, default=5.0, metavar="MS",
                       help="how long a request waits for others to share its batch")
    serve.add_argument("--max-batch-sentences", type=int, default=256, metavar="N",
                       help="sentences per decoding batch")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(func=cmd_serve)

    export = commands.add_parser("export", help="write a checkpoint as a deployable model "
                                 "folder (safetensors, or CTranslate2 with int8)")
    export.add_argument("--run", help="run directory (default: the latest run under --runs-dir)")
    export.add_argument("--checkpoint", metavar="best|last|PATH", help="as for translate "
                        "(default: best.pt)")
    export.add_argument("--runs-dir", default="runs", help="where to look for the latest run")
    export.add_argument("--format", required=True, choices=("safetensors", "ctranslate2"))
    export.add_argument("--quantization", choices=("float32", "int8", "int8_float32"),
                        help="ctranslate2 weights (default float32; int8: about 4x smaller "
                        "and faster on CPU)")
    export.add_argument("--output", required=True, metavar="DIR", help="new folder to write")
    export.set_defaults(func=cmd_export)
    return parser



def _add_model_options(parser: argparse.ArgumentParser) -> None:
    """Which model to load and how to decode: shared by translate, evaluate and serve."""
    parser.add_argument("--run", help="run directory (default: the latest run under --runs-dir)")
    parser.add_argument("--checkpoint", metavar="best|last|PATH", help="the run's best.pt "
                        "(default; last.pt before the first validation), its last.pt, or a "
                        "checkpoint file")
    parser.add_argument("--model", metavar="EXPORT_DIR", help="a folder written by tmt export "
                        "(safetensors or ctranslate2) instead of a run's checkpoint")
    parser.add_argument("--runs-dir", default="runs", help="where to look for the latest run")
    parser.add_argument("--beam", type=int, metavar="K", help="beam size; 1: greedy search "
                        "(default: the run's decode.beam_size)")
    parser.add_argument("--batch-tokens", type=int, metavar="N", help="at most N padded source "
                        "tokens per decoding batch (default: decode.batch_tokens)")
    parser.add_argument("--length-penalty", type=float, metavar="ALPHA", help="beam search "
                        "ranks by log-probability / ((5 + length) / 6) ** ALPHA; 0: raw "
                        "log-probability (default: decode.length_penalty)")
    parser.add_argument("--max-len-a", type=float, metavar="A", help="outputs stop at A * "
                        "source tokens + B (default: decode.max_len_a)")
    parser.add_argument("--max-len-b", type=int, metavar="B", help="see --max-len-a "
                        "(default: decode.max_len_b)")
    parser.add_argument("--sample-topk", type=int, metavar="K", help="sample each token from "
                        "the K most probable instead of searching (e.g. for back-translation; "
                        "0: off)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default 1.0; "
                        "lower is closer to greedy)")
    parser.add_argument("--seed", type=int, help="seed for --sample-topk: the same seed gives "
                        "the same samples")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "mps"))
    parser.add_argument("--replace-unk", action=argparse.BooleanOptionalAction,
                        help="write each [UNK] of the output as the source word it attends to "
                        "most (default: on for word-level vocabularies, off for BPE)")


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["train"]:
        reexec_with_tcmalloc()      # the `tmt` command itself: before anything allocates much
    configure_openmp()              # before the commands import torch
    args = build_parser().parse_args(argv)
    code = _run_command(args)
    # Only `tmt train` under torchrun loads this module's distributed part (looked up rather
    # than imported, so that commands that never load torch stay quick).
    distributed = sys.modules.get(f"{__package__}.distributed")
    if distributed is not None and distributed.joined():
        distributed.exit_process(code)
    return code


def _run_command(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except TmtError as exc:
        print(f"tmt: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tmt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `tmt translate ... | head -1`): nothing left to do. Point
        # stdout at /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
