"""scripts/load_test.py drives a real server on tiny settings, stops by itself, and reports
every level with no errors and no lost requests."""

import json
import subprocess
import sys

from conftest import ROOT

LEVEL_KEYS = {"clients", "requests", "ok", "errors", "lost", "sentences_per_s", "p50_ms",
              "p95_ms", "p99_ms", "decode_p50_ms", "decode_max_ms"}


def test_load_test_reports_each_level_and_stops_the_server(varied_model):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "load_test.py"), "--checkpoint",
         str(varied_model), "--clients", "1", "4", "--requests", "12", "--seconds", "60",
         "--serve-arg=--device=cpu", "--json"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [level["clients"] for level in report["levels"]] == [1, 4]
    for level in report["levels"]:
        assert LEVEL_KEYS <= set(level)
        assert level["requests"] == level["ok"] == 12 and level["errors"] == level["lost"] == 0
        assert level["p50_ms"] <= level["p95_ms"] <= level["p99_ms"]
    assert report["server_exit_status"] == 0 and report["throughput_ratio"] > 0
