"""Draw a run's training curves from its TensorBoard event files into one PNG.

    python scripts/plot_run.py RUN_DIR out.png [--x step|hours]

Left: train and valid loss (per token); right: valid BLEU and chrF. --x hours puts training time
(the sittings of a resumed run back to back, pauses left out) on the horizontal axis.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matplotlib.figure import Figure

from transformer_mt.events import Scalar, read_scalars


def _series(values: list[Scalar], x: str) -> tuple[list[float], list[float]]:
    return [v.hours if x == "hours" else v.step for v in values], [v.value for v in values]


def plot_run(run_dir: Path, output: Path, x: str = "step") -> None:
    scalars = read_scalars(run_dir / "tensorboard")
    if not scalars.get("train/loss") and not scalars.get("valid/bleu"):
        raise SystemExit(f"plot_run: no training scalars in {run_dir / 'tensorboard'}; "
                         f"is {run_dir} a tmt run that has logged at least once?")
    figure = Figure(figsize=(11, 4), layout="constrained")
    loss_axes, score_axes = figure.subplots(1, 2)
    for tag, label in (("train/loss", "train"), ("valid/loss", "valid")):
        if tag in scalars:
            loss_axes.plot(*_series(scalars[tag], x), label=label,
                           marker="o" if label == "valid" else None, markersize=3)
    loss_axes.set_ylabel("loss (label-smoothed cross-entropy per token)")
    for tag, label in (("valid/bleu", "BLEU"), ("valid/chrf", "chrF")):
        if tag in scalars:
            score_axes.plot(*_series(scalars[tag], x), label=label, marker="o", markersize=3)
    score_axes.set_ylabel("validation score (sacreBLEU)")
    for axes in (loss_axes, score_axes):
        axes.set_xlabel("training hours" if x == "hours" else "step")
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(run_dir.resolve().name)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a tmt run directory (runs/<name>)")
    parser.add_argument("output", type=Path, help="PNG file to write")
    parser.add_argument("--x", choices=("step", "hours"), default="step",
                        help="horizontal axis: optimizer steps or training hours")
    args = parser.parse_args(argv)
    plot_run(args.run_dir, args.output, args.x)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
