"""scripts/bench.py runs end to end on tiny settings and prints the keys the README reports."""

import json
import subprocess
import sys

from conftest import ROOT

from transformer_mt.allocator import find_tcmalloc

KEYS = {"gemm_gflops", "model", "train_tokens_per_s", "model_flops_per_token", "mfu",
        "padding_efficiency", "peak_rss_mb", "greedy_sents_per_s", "uncached_sents_per_s",
        "greedy_speedup", "beam4_sents_per_s", "beam4_time_over_greedy", "ct2_device",
        "ct2_float32_greedy_sents_per_s", "ct2_float32_same_output", "ct2_int8_greedy_sents_per_s",
        "ct2_int8_speedup"}


TINY = ["--corpus-lines", "400",
        "--d-model", "32", "--layers", "1", "--heads", "2", "--d-ff", "64",
        "--batch-tokens", "256", "--warmup-steps", "1", "--train-seconds", "0",
        "--min-train-steps", "2", "--gemm-size", "64", "--decode-sentences", "8",
        "--decode-batch", "4", "--decode-len", "3", "--uncached-sentences", "2"]


def test_bench_prints_one_json_object_with_the_reported_keys(tmp_path):
    args = ["--json", "--data", str(tmp_path / "absent.tsv"), *TINY]
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert KEYS <= set(report)
    assert report["data"] == "synthetic" and report["train_steps"] == 2
    assert report["model"]["d_model"] == 32 and report["model"]["tgt_vocab"] > 4
    assert 0 < report["padding_efficiency"] <= 1 and report["mfu"] > 0
    assert report["uncached_same_output"] == "2/2"
    assert report["ct2_float32_same_output"] == "8/8"
    # It measures the allocator tmt train runs with.
    assert report["allocator"] == ("tcmalloc" if find_tcmalloc() else "glibc malloc")


def test_bench_accumulates_batches_into_one_optimizer_step(tmp_path):
    """--accumulate K: each timed step takes K batches, as train.accumulate groups them."""
    def tokens_per_step(*extra: str) -> float:
        args = ["--json", "--data", str(tmp_path / "absent.tsv"), *TINY, *extra]
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *args],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["accumulate"] == (int(extra[1]) if extra else 1)
        return report["train_tokens_per_step"]
    single, double = tokens_per_step(), tokens_per_step("--accumulate", "2")
    assert 1.6 * single < double < 2.4 * single


def test_bench_under_torchrun_measures_data_parallel_training_once(tmp_path):
    """Two ranks train in step (same step count), their tokens are summed, rank 0 alone prints."""
    args = ["--json", "--data", str(tmp_path / "absent.tsv"), "--device", "cpu", *TINY]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc_per_node=2", str(ROOT / "scripts" / "bench.py"), *args],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, result.stdout
    report = json.loads(lines[0])
    assert report["world_size"] == 2 and report["train_steps"] == 2
    assert report["train_tokens_per_s"] > 0 and report["mfu"] > 0
    assert "greedy_sents_per_s" not in report          # decoding is measured without torchrun
