"""Benchmark: the batch plan of N random pair lengths (default 10 M), vectorised against the
per-example loop it replaced (the reference kept in tests/unit/test_batch_plan.py); checks that both
give the same plan.

    python scripts/bench_plan.py [N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))

from test_batch_plan import reference_plan  # noqa: E402

from transformer_mt.batching import TokenBatchSampler  # noqa: E402


def main(argv: list[str]) -> int:
    pairs = int(argv[0]) if argv else 10_000_000
    lengths = np.random.default_rng(0).integers(3, 60, size=(pairs, 2))
    started = time.perf_counter()
    sampler = TokenBatchSampler(lengths, 4096, seed=0)
    plan = sampler.batches(0)
    vectorised = time.perf_counter() - started
    started = time.perf_counter()
    reference = reference_plan(sampler, 0)
    loop = time.perf_counter() - started
    same = len(plan) == len(reference) and all(map(np.array_equal, plan, reference))
    print(f"pairs {pairs:,}  batches {len(plan):,}  same plan {same}  "
          f"vectorised {vectorised:.1f} s  per-example loop {loop:.1f} s  ({loop / vectorised:.1f}x)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
