"""Draw training curves from tmt runs' TensorBoard event files into one PNG.

    python scripts/plot_run.py RUN_DIR [RUN_DIR ...] out.png [--x step|hours]

Left: train loss (solid) and valid loss (dashed, dots) per token; right: valid BLEU (solid) and
chrF (dashed). One colour per run, so several runs can be compared on one picture. --x hours puts
training time on the horizontal axis (the sittings of a resumed run back to back, the pauses
between them left out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matplotlib.figure import Figure

from transformer_mt.events import Scalar, read_scalars

CURVES = {  # tag: (panel, line style, label)
    "train/loss": (0, "-", "train loss"), "valid/loss": (0, "--", "valid loss"),
    "valid/bleu": (1, "-", "BLEU"), "valid/chrf": (1, "--", "chrF"),
}


def _series(values: list[Scalar], x: str) -> tuple[list[float], list[float]]:
    return [v.hours if x == "hours" else v.step for v in values], [v.value for v in values]


def plot_runs(run_dirs: list[Path], output: Path, x: str = "step") -> None:
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    panels = figure.subplots(1, 2)
    for index, run_dir in enumerate(run_dirs):
        scalars = read_scalars(run_dir / "tensorboard")
        if not scalars.get("train/loss"):
            raise SystemExit(f"plot_run: no training scalars in {run_dir / 'tensorboard'}; is "
                             f"{run_dir} a tmt run that has logged at least once?")
        name = run_dir.resolve().name
        for tag, (panel, style, label) in CURVES.items():
            if tag in scalars:
                panels[panel].plot(*_series(scalars[tag], x), style, color=f"C{index}",
                                   label=f"{name}: {label}" if len(run_dirs) > 1 else label,
                                   marker="o" if tag.startswith("valid") else None,
                                   markersize=3)
    panels[0].set_ylabel("loss (label-smoothed cross-entropy per token)")
    panels[1].set_ylabel("validation score (sacreBLEU)")
    for axes in panels:
        axes.set_xlabel("training hours" if x == "hours" else "step")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(", ".join(run_dir.resolve().name for run_dir in run_dirs))
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR",
                        help="tmt run directories (runs/<name>)")
    parser.add_argument("output", type=Path, help="PNG file to write")
    parser.add_argument("--x", choices=("step", "hours"), default="step",
                        help="horizontal axis: optimizer steps or training hours")
    args = parser.parse_args(argv)
    plot_runs(args.run_dirs, args.output, args.x)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
