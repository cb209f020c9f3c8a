"""Model sizes compared at equal CPU time (README, "Model size at equal CPU time").

A 3-hour CPU run for every candidate size is out of reach, so the comparison has two parts:

  time   each size's CPU seconds per step on the same batches (same seed, same data), nothing
         else running: `tmt train`, timed from step 20 for --timed-steps steps by the wall times
         of its TensorBoard scalars, in --rounds rounds over the sizes, every other round in
         reverse order, the mean kept. The rounds are there because a machine's speed drifts:
         the development VM's by a fifth within an hour (README), so sizes timed once, one
         after the other, are compared at different speeds.
  train  each size for as many steps as the CPU runs in the time the first size takes for
         --base-steps steps (default: the config's max_steps; steps = base_steps * t_first /
         t_size), the final decay the same share of them (default: the config's); all at once
         on a GPU (at these sizes a step there waits for Python, not for the GPU, so the runs
         share it well); then each scored: valid split (last.pt and the average of
         the last 4 step checkpoints, greedy; the average with beam 4) and test split with
         --unseen (beam 4).

    python scripts/size_sweep.py time  --out sweep 256:3:4:1024 192:3:3:768 384:3:6:1536
    python scripts/size_sweep.py train --out sweep --device cuda --set model.dropout=0.0 --seeds 42 7
    python scripts/size_sweep.py train --out sweep/dropout0.1 --timings sweep/step_times.json \
        --device cuda --set model.dropout=0.1 384:3:6:1536

A size is d_model:layers:heads:d_ff; everything else comes from --config. Interrupted (Ctrl-C:
each run saves its checkpoint), `train` run again resumes the unfinished runs and scores the
runs not scored yet.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from transformer_mt.config import load_config
from transformer_mt.events import read_scalars

ROOT = Path(__file__).resolve().parents[1]
TMT = [sys.executable, "-m", "transformer_mt"]
TIMED_FROM = 20   # the first steps allocate


def size_overrides(size: str) -> list[str]:
    d_model, layers, heads, d_ff = size.split(":")
    return ["--set", f"model.d_model={d_model}", "--set", f"model.layers={layers}",
            "--set", f"model.heads={heads}", "--set", f"model.d_ff={d_ff}"]


def size_name(size: str) -> str:
    d_model, layers, heads, d_ff = size.split(":")
    return f"d{d_model}_l{layers}_h{heads}_ff{d_ff}"


def finished(run: Path) -> bool:
    lines = (run / "train.log").read_text().splitlines() if (run / "train.log").exists() else []
    return bool(lines) and "finished at step" in lines[-1]


def time_sizes(args) -> None:
    timed_to = TIMED_FROM + args.timed_steps
    rounds: dict[str, list[float]] = {size: [] for size in args.sizes}
    for number in range(args.rounds):
        for size in args.sizes if number % 2 == 0 else args.sizes[::-1]:
            run = args.out / "time" / f"{size_name(size)}_round{number}"
            if not (run / "train.log").exists():
                subprocess.run([*TMT, "train", "--config", str(args.config), "--run-dir",
                                str(run), *size_overrides(size), *args.set,
                                "--set", "train.log_every=10", "--set", "train.valid_every=100000",
                                "--set", "train.checkpoint_every=100000",
                                "--max-steps", str(timed_to), "--device", "cpu"], check=True)
            hours = {s.step: s.hours for s in read_scalars(run / "tensorboard")["train/loss"]}
            rounds[size].append((hours[timed_to] - hours[TIMED_FROM]) * 3600 / args.timed_steps)
            print(f"{size}, round {number + 1}: {rounds[size][-1]:.3f} s a step", flush=True)
    timings = {size: sum(times) / len(times) for size, times in rounds.items()}
    (args.out / "step_times.json").write_text(json.dumps(timings, indent=1) + "\n")
    (args.out / "step_times_rounds.json").write_text(json.dumps(rounds, indent=1) + "\n")


def train_sizes(args) -> None:
    timings = json.loads((args.timings or args.out / "step_times.json").read_text())
    first = next(iter(timings))
    # The budget and decay share default to the config's own schedule (its max_steps are the
    # first size's steps), so they cannot disagree with the config the runs start from.
    train = load_config(args.config, [kv.removeprefix("--set=") for kv in args.set]).train
    base_steps = args.base_steps or train.max_steps
    decay_share = args.decay_share if args.decay_share is not None else \
        (train.decay_steps or 0) / train.max_steps
    runs, processes = {}, []
    for size, seconds in timings.items():
        if args.sizes and size not in args.sizes:
            continue
        steps = round(base_steps * timings[first] / seconds / 50) * 50
        decay = round(steps * decay_share / 50) * 50
        for seed in args.seeds:
            run = args.out / "runs" / f"{size_name(size)}_seed{seed}"
            runs[run] = (size, steps)
            if finished(run):
                continue
            if (run / "checkpoints" / "last.pt").exists():
                command = [*TMT, "train", "--run-dir", str(run), "--resume"]
            else:
                command = [*TMT, "train", "--config", str(args.config), "--run-dir", str(run),
                           *size_overrides(size), *args.set, "--set", f"train.seed={seed}",
                           "--set", f"train.max_steps={steps}",
                           "--set", f"train.decay_steps={decay or 'null'}",
                           "--set", f"train.threads={args.threads}", "--set", "train.keep_last=4",
                           "--set", "train.valid_every=500", "--device", args.device]
            print(f"{run.name}: {steps} steps, the last {decay} decaying", flush=True)
            run.parent.mkdir(parents=True, exist_ok=True)
            output = run.parent / f"{run.name}.out"
            with output.open("w") as out:
                processes.append((subprocess.Popen(command, stdout=out, stderr=out), output))
    for process, output in processes:
        if process.wait() != 0:
            last = (output.read_text().strip().splitlines() or ["(no output)"])[-1]
            print(f"{output.stem}: exit {process.returncode}: {last}", flush=True)
    results = {run.name: score(run, size, steps, args.device)
               for run, (size, steps) in runs.items() if finished(run)}
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"{'run':<28} {'steps':>6} {'loss':>6} | valid: last  avg4  avg4 beam 4 | test beam 4 "
          f"| names (copied) | rare")
    for name, r in results.items():
        names, rare = r["test"]["unseen"]["names"], r["test"]["unseen"]["rare_words"]
        print(f"{name:<28} {r['steps']:>6} {r['valid_loss']:>6.3f} | {r['valid_last']:>11.2f} "
              f"{r['valid_avg4']:>5.2f} {r['valid_avg4_beam4']:>12.2f} | {r['test']['bleu']:>11.2f} "
              f"| {names['bleu']:.2f} ({names.get('names_copied', 0):.1%}) | {rare['bleu']:.2f}")


def evaluate(checkpoint: Path, name: str, device: str, *options: str) -> dict:
    hypotheses = checkpoint.parent.parent / "sweep" / f"{name}.hyp"
    hypotheses.parent.mkdir(exist_ok=True)
    subprocess.run([*TMT, "evaluate", "--checkpoint", str(checkpoint), "--json", "--device",
                    device, "--output", str(hypotheses), *options], check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads(hypotheses.with_suffix(".json").read_text())


def score(run: Path, size: str, steps: int, device: str) -> dict:
    """The run's scores, computed once (kept in RUN/sweep/scores.json)."""
    saved = run / "sweep" / "scores.json"
    if saved.exists():
        return json.loads(saved.read_text())
    average = run / "checkpoints" / "avg_last4.pt"
    if not average.exists():
        subprocess.run([*TMT, "average", "--run", str(run), "--last", "4", "--output",
                        str(average)], check=True, stdout=subprocess.DEVNULL)
    valid_loss = read_scalars(run / "tensorboard")["valid/loss"][-1].value
    greedy, beam4 = ("--beam", "1"), ("--beam", "4", "--length-penalty", "1.0")
    scores = {
        "size": size, "steps": steps, "valid_loss": valid_loss,
        "valid_last": evaluate(run / "checkpoints" / "last.pt", "valid_last", device,
                               "--split", "valid", *greedy)["bleu"],
        "valid_avg4": evaluate(average, "valid_avg4", device, "--split", "valid", *greedy)["bleu"],
        "valid_avg4_beam4": evaluate(average, "valid_avg4_beam4", device, "--split", "valid",
                                     *beam4)["bleu"],
        "test": evaluate(average, "test_avg4_beam4", device, "--unseen", *beam4),
    }
    saved.write_text(json.dumps(scores, indent=1) + "\n")
    return scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("time", "train"))
    p.add_argument("sizes", nargs="*", help="d_model:layers:heads:d_ff: to time (the first "
                   "sets the time budget), or to train of those timed (default: all)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "tatoeba_en_it_d256.yaml")
    p.add_argument("--set", action="append", default=[], type=lambda kv: f"--set={kv}",
                   help="config override for every run (repeatable), e.g. model.dropout=0.0")
    p.add_argument("--timed-steps", type=int, default=100,
                   help="steps timed for each size in each round (a multiple of 10)")
    p.add_argument("--rounds", type=int, default=2, help="timings of each size (interleaved)")
    p.add_argument("--timings", type=Path, help="step_times.json of `time` (default: in --out), "
                   "to train one set of timings with other overrides into another --out")
    p.add_argument("--base-steps", type=int,
                   help="steps of the first size that set the time budget "
                        "(default: the config's train.max_steps)")
    p.add_argument("--decay-share", type=float,
                   help="share of each run's steps in its final decay "
                        "(default: the config's train.decay_steps / train.max_steps)")
    p.add_argument("--seeds", type=int, nargs="+", default=[42])
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of each run")
    args = p.parse_intermixed_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode == "time":
        if not args.sizes:
            p.error("time needs the sizes")
        time_sizes(args)
    else:
        train_sizes(args)


if __name__ == "__main__":
    main()
