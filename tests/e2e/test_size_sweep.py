"""scripts/size_sweep.py: CPU step times, then each size trained for the steps of an equal time."""

import json
import subprocess
import sys

import yaml
from conftest import ROOT, tiny_config_text

SWEEP = [sys.executable, str(ROOT / "scripts" / "size_sweep.py")]
SMALL, LARGE = "32:1:2:64", "48:1:2:96"


def sweep(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([*SWEEP, *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_time_writes_the_mean_seconds_per_step_of_each_size_over_interleaved_rounds(
        tmp_path, corpus_tsv):
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config_text(corpus_tsv), encoding="utf-8")
    out = tmp_path / "sweep"
    result = sweep("time", SMALL, LARGE, "--out", str(out), "--config", str(config),
                   "--timed-steps", "20", "--rounds", "2")
    # Round 1 in the given order, round 2 reversed: the large size is timed twice in a row.
    order = [line.split(",")[0] for line in result.stdout.splitlines() if "round" in line]
    assert order == [SMALL, LARGE, LARGE, SMALL]
    rounds = json.loads((out / "step_times_rounds.json").read_text())
    timings = json.loads((out / "step_times.json").read_text())
    assert list(timings) == [SMALL, LARGE]
    for size in (SMALL, LARGE):
        assert len(rounds[size]) == 2 and min(rounds[size]) > 0
        assert timings[size] == sum(rounds[size]) / 2


def test_each_size_trains_for_the_steps_of_the_first_ones_time(tmp_path, corpus_tsv):
    """A size twice as slow a step gets half the steps; the decay is the same share of each run;
    every finished run is scored; a second call retrains and rescores nothing. The budget and the
    decay share come from the config's schedule (200 steps, the last 100 decaying)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config_text(corpus_tsv), encoding="utf-8")
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "step_times.json").write_text(json.dumps({SMALL: 0.5, LARGE: 1.0}))
    args = ("train", "--out", str(out), "--config", str(config), "--device", "cpu",
            "--set", "train.max_steps=200", "--set", "train.decay_steps=100",
            "--set", "train.checkpoint_every=25")
    sweep(*args)
    results = json.loads((out / "results.json").read_text())
    assert {r["size"]: r["steps"] for r in results.values()} == {SMALL: 200, LARGE: 100}
    for name, r in results.items():
        run = out / "runs" / name
        train = yaml.safe_load((run / "config.yaml").read_text())["train"]
        assert train["max_steps"] == r["steps"] and train["decay_steps"] == r["steps"] // 2
        assert f"finished at step {r['steps']} " in (run / "train.log").read_text()
        assert 0 <= r["valid_avg4_beam4"] <= 100 and 0 <= r["test"]["bleu"] <= 100
        assert {"names", "rare_words"} <= set(r["test"]["unseen"])
    written = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/**/*") if p.is_file()}
    sweep(*args)
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/**/*") if p.is_file()} == written
    assert json.loads((out / "results.json").read_text()) == results
