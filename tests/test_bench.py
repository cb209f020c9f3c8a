"""scripts/bench.py runs end to end on tiny settings and prints the keys the README reports."""

import json
import subprocess
import sys

from conftest import ROOT

KEYS = {"gemm_gflops", "model", "train_tokens_per_s", "model_flops_per_token", "mfu",
        "padding_efficiency", "peak_rss_mb", "greedy_sents_per_s", "uncached_sents_per_s",
        "greedy_speedup", "beam4_sents_per_s", "beam4_time_over_greedy"}


def test_bench_prints_one_json_object_with_the_reported_keys(tmp_path):
    args = ["--json", "--data", str(tmp_path / "absent.tsv"), "--corpus-lines", "400",
            "--d-model", "32", "--layers", "1", "--heads", "2", "--d-ff", "64",
            "--batch-tokens", "256", "--warmup-steps", "1", "--train-seconds", "0",
            "--min-train-steps", "2", "--gemm-size", "64", "--decode-sentences", "8",
            "--decode-batch", "4", "--decode-len", "3", "--uncached-sentences", "2"]
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert KEYS <= set(report)
    assert report["data"] == "synthetic" and report["train_steps"] == 2
    assert report["model"]["d_model"] == 32 and report["model"]["tgt_vocab"] > 4
    assert 0 < report["padding_efficiency"] <= 1 and report["mfu"] > 0
    assert report["uncached_same_output"] == "2/2"
