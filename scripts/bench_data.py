"""Benchmark the data path at scale: preparation and resume of corpora of millions of pairs.

    python scripts/bench_data.py --pairs 1000000 3000000 --json
    python scripts/bench_data.py --pairs 200000 --config configs/tiny.yaml

For each size N it writes (once, cached under --work) a deterministic synthetic corpus of N pairs
made from the Tatoeba file: pair i joins two Tatoeba pairs drawn by a seeded generator, so that
sentences are about twice as long as Tatoeba's (~15 words a side) and almost all distinct, like a
real large corpus. Then it runs the real command, as a user would:

    tmt train --config CONFIG --set data.path=CORPUS --set data.max_len=100 --max-steps 1
    tmt train --run-dir RUN --resume --max-steps 1+R --set train.log_every=1   (R: --resume-steps)

and reports for each: wall time (for the resume also the time until its first step is logged,
and over its steps after the first: the median tokens/s and the mean share of time spent
waiting for batches, `data wait`, as train.log reports them),
and peak memory of the whole process tree (the largest sum of
the proportional set sizes of tmt and its DataLoader workers, sampled every 0.2 s; PSS counts a
page shared by k processes as 1/k in each; how much of the peak is pages of mapped files,
libraries mostly, is reported beside it). The stage lines that preparation writes to train.log
(`stage NAME: S s, ..., peak RSS M MB`) give each stage's time and the peak RSS of
preparation up to its end (before training starts).

The absolute times depend on the machine's load; run it alone. Peak memory does not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TATOEBA = ROOT.parent / "shared" / "data" / "tatoeba-en-it" / "en-it.tsv"
STAGE_LINE = re.compile(r"stage (?P<name>[\w ]+): (?P<seconds>[\d.]+) s"
                        r"(?:.*peak RSS (?P<peak_mb>[\d,]+) MB)?")
STEP_LINE = re.compile(r"^(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO step \d+:"
                       r"(?:.* (?P<tokens_per_s>[\d.]+) tokens/s, data wait (?P<data_wait>[\d.]+)%)?",
                       re.MULTILINE)
WRITE_CHUNK = 200_000


def synthetic_corpus(source: Path, pairs: int, out: Path, seed: int = 0) -> Path:
    """N pairs, each two source pairs joined with a space, written in chunks (bounded memory)."""
    if out.is_file():
        return out
    lines = [line.split("\t") for line in source.read_text(encoding="utf-8").splitlines()
             if line.count("\t") == 1]
    rng = np.random.default_rng(seed)
    tmp = out.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as handle:
        for start in range(0, pairs, WRITE_CHUNK):
            n = min(WRITE_CHUNK, pairs - start)
            first, second = rng.integers(0, len(lines), size=(2, n))
            handle.writelines(f"{lines[a][0]} {lines[b][0]}\t{lines[a][1]} {lines[b][1]}\n"
                              for a, b in zip(first.tolist(), second.tolist()))
    tmp.replace(out)
    return out


def _process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _pss_kb(pid: int) -> tuple[int, int]:
    """Proportional set size of `pid` (kB), and the part of it that is pages of mapped files
    (libraries, and any data file the process maps: page cache, not memory it allocated)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    found = {key: int(value) for key, value in
             re.findall(r"^(Pss|Pss_File):\s+(\d+) kB", text, re.MULTILINE)}
    return found.get("Pss", 0), found.get("Pss_File", 0)


def measure(command: list[str], log_file: Path) -> dict:
    """Run `command`; its wall time, exit code and peak memory of its process tree."""
    started = time.perf_counter()
    started_at = time.time()
    with open(log_file, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=dict(os.environ, HF_HUB_OFFLINE="1",
                                            HF_DATASETS_OFFLINE="1"))
    peak = {"tree_kb": 0, "file_kb": 0, "processes": 0}

    def sample() -> None:
        while process.poll() is None:
            tree = _process_tree(process.pid)
            sizes = [_pss_kb(pid) for pid in tree]
            total, file = sum(s for s, _ in sizes), sum(f for _, f in sizes)
            if total > peak["tree_kb"]:
                peak.update(tree_kb=total, file_kb=file, processes=len(tree))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    sampler.join()
    return {"started_at": started_at,
            "seconds": round(time.perf_counter() - started, 1), "exit_code": process.returncode,
            "peak_tree_mb": round(peak["tree_kb"] / 1024),
            "file_pages_at_peak_mb": round(peak["file_kb"] / 1024), "processes": peak["processes"],
            "peak_rss_main_mb": round(usage.ru_maxrss / 1024)}


def stage_lines(run_dir: Path) -> dict[str, dict]:
    """Each preparation stage's seconds and the process's peak RSS (MB) at its end."""
    log = run_dir / "train.log"
    if not log.is_file():
        return {}
    return {m["name"]: {"seconds": float(m["seconds"]),
                        "peak_rss_mb": int(m["peak_mb"].replace(",", "")) if m["peak_mb"] else None}
            for m in STAGE_LINE.finditer(log.read_text())}


def first_step_seconds(run_dir: Path, started_at: float) -> float | None:
    """Seconds from `started_at` to the first `step N:` line logged after it in train.log (the
    resume runs with train.log_every=1, so that is its first optimizer step done)."""
    log = run_dir / "train.log"
    if not log.is_file():
        return None
    for found in STEP_LINE.finditer(log.read_text()):
        logged = datetime.strptime(found["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if logged >= started_at:
            return round(logged - started_at, 1)
    return None


def step_rates(run_dir: Path, started_at: float) -> dict:
    """Median tokens/s and mean data wait (%) of the step lines logged after `started_at`, the
    first one (warm-up) left out."""
    log = run_dir / "train.log"
    found = [m for m in STEP_LINE.finditer(log.read_text()) if m["tokens_per_s"]
             and datetime.strptime(m["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp() >= started_at]
    found = found[1:]
    if not found:
        return {}
    return {"steps": len(found),
            "median_tokens_per_s": float(np.median([float(m["tokens_per_s"]) for m in found])),
            "mean_data_wait_percent": round(float(np.mean([float(m["data_wait"])
                                                           for m in found])), 2)}


def bench_size(pairs: int, args: argparse.Namespace) -> dict:
    corpus = synthetic_corpus(Path(args.source), pairs, args.work / f"synthetic_{pairs}.tsv")
    run_dir = args.work / f"run_{pairs}_{int(time.time())}"
    tmt = [sys.executable, "-m", "transformer_mt", "train"]
    overrides = ["--set", f"data.path={corpus}", "--set", f"data.max_len={args.max_len}",
                 "--set", f"train.num_workers={args.workers}", *sum((["--set", s] for s in
                                                                      args.set), [])]
    prepare = measure([*tmt, "--config", str(args.config), *overrides, "--run-dir", str(run_dir),
                       "--max-steps", "1"], args.work / f"prepare_{pairs}.log")
    resume = measure([*tmt, "--run-dir", str(run_dir), "--resume", "--max-steps",
                      str(1 + args.resume_steps), "--set", "train.log_every=1"],
                     args.work / f"resume_{pairs}.log")
    started_at = resume.pop("started_at")
    resume["first_step_seconds"] = first_step_seconds(run_dir, started_at)
    resume.update(step_rates(run_dir, started_at))
    prepare.pop("started_at")
    result = {"pairs": pairs, "prepare": prepare, "resume": resume,
              "stages": stage_lines(run_dir)}
    if not args.keep_runs:
        subprocess.run(["rm", "-rf", str(run_dir)], check=False)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tatoeba_en_it_word.yaml")
    parser.add_argument("--source", default=str(TATOEBA), help="TSV to build corpora from")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tmt_bench_data"),
                        help="where corpora (cached) and runs go")
    parser.add_argument("--max-len", type=int, default=100)
    parser.add_argument("--workers", type=int, default=0, help="train.num_workers")
    parser.add_argument("--resume-steps", type=int, default=1,
                        help="steps the resume trains (tokens/s and data wait over all but the first)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more config overrides")
    parser.add_argument("--keep-runs", action="store_true")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    if not Path(args.source).is_file():
        print(f"bench_data: source corpus not found: {args.source}", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for pairs in args.pairs:
        results.append(bench_size(pairs, args))
        if not args.json:
            r = results[-1]
            print(f"{pairs:>11,} pairs: prepare {r['prepare']['seconds']} s, peak "
                  f"{r['prepare']['peak_tree_mb']} MB (exit {r['prepare']['exit_code']}); "
                  f"resume {r['resume']['seconds']} s (first step after "
                  f"{r['resume']['first_step_seconds']} s), peak {r['resume']['peak_tree_mb']} MB "
                  f"({r['resume']['file_pages_at_peak_mb']} MB of it mapped files), "
                  f"{r['resume'].get('median_tokens_per_s')} tokens/s, data wait "
                  f"{r['resume'].get('mean_data_wait_percent')}%; "
                  f"stages {r['stages']}", flush=True)
    if args.json:
        print(json.dumps({"config": str(args.config), "workers": args.workers,
                          "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
