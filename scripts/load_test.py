"""Load test: a real `tmt serve` process on a free loopback port, driven by 1, 8 and 32
concurrent clients that each send one test sentence per request.

    python scripts/load_test.py --run runs/tatoeba_en_it             # the run's test split
    python scripts/load_test.py --model exports/int8 --json          # one JSON object on stdout
    python scripts/load_test.py --run R --clients 1 4 --requests 50 --serve-arg=--batch-wait-ms=10

Per level it reports sentences/s (answered requests over the level's wall time), latency
percentiles p50/p95/p99, errors (a non-200 answer or a failed connection) and lost requests
(sent but never answered). Bounded: each level stops after --requests requests or --seconds
seconds, whichever comes first, every request has a timeout, and the server is stopped with
SIGTERM at the end (its exit status is reported). It listens on 127.0.0.1 only.

Targets (issue 15, Tatoeba model on the 2-core CPU): 0 errors and 0 lost; throughput at 32
clients >= 5x that at 1 client; p95 latency at 32 clients <= 0.5 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REQUEST_TIMEOUT = 30.0
START_TIMEOUT = 180.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--run", help="run directory (its best.pt, and its test split)")
    model.add_argument("--checkpoint", help="checkpoint file inside a run")
    model.add_argument("--model", help="a tmt export folder")
    parser.add_argument("--sentences", metavar="FILE", help="source sentences, one per line "
                        "(default: the run's test split)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=300, help="requests per level")
    parser.add_argument("--seconds", type=float, default=60.0, help="time cap per level")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for tmt serve (repeatable), e.g. "
                        "--serve-arg=--batch-wait-ms=10")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if min(args.clients) < 1 or args.requests < 1 or args.seconds <= 0:
        parser.error("--clients and --requests must be at least 1, --seconds positive")
    return args


def load_sentences(args: argparse.Namespace) -> list[str]:
    if args.sentences:
        lines = Path(args.sentences).read_text(encoding="utf-8").splitlines()
    else:
        from transformer_mt.evaluate import run_held_out_set
        from transformer_mt.export import read_manifest
        from transformer_mt.rundir import RunDir

        if args.run:
            run = Path(args.run)
        elif args.checkpoint:
            run = Path(args.checkpoint).resolve().parent.parent
        else:
            run = Path(read_manifest(Path(args.model))["checkpoint"]).parent.parent
        lines = run_held_out_set(RunDir(run)).sources
    lines = [line for line in lines if line.strip()]
    if not lines:
        sys.exit("load_test: no sentences to send")
    return lines


class Server:
    """`tmt serve --host 127.0.0.1 --port 0`; the chosen port is read from its stderr."""

    def __init__(self, model_args: list[str], extra: list[str]):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "transformer_mt", "serve", *model_args, *extra,
             "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.log: list[str] = []
        ready = threading.Event()
        self.url = ""

        def read() -> None:
            for line in self.process.stderr:
                self.log.append(line)
                if found := re.search(r"listening on (http://127\.0\.0\.1:\d+)/", line):
                    self.url = found.group(1)
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                sys.exit("load_test: tmt serve did not start:\n" + "".join(self.log))

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)


def post(url: str, text: str | list[str]) -> float | None:
    """The server's decoding seconds for the batch that held `text`; None on failure."""
    body = json.dumps({"text": text}).encode()
    request = urllib.request.Request(url + "/translate", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
            answer = json.loads(response.read())
            expected = 1 if isinstance(text, str) else len(text)
            if response.status == 200 and len(answer["translations"]) == expected:
                return answer["seconds"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        pass
    return None


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run_level(url: str, sentences: list[str], clients: int, requests: int,
              seconds: float) -> dict:
    """`clients` threads send requests back to back until `requests` were sent or `seconds`
    passed."""
    numbers = itertools.count()
    lock = threading.Lock()
    latencies: list[float] = []
    decode_seconds: list[float] = []
    counts = {"sent": 0, "ok": 0, "errors": 0}
    started = time.perf_counter()
    deadline = started + seconds

    def client() -> None:
        while time.perf_counter() < deadline:
            with lock:
                number = next(numbers)
                if number >= requests:
                    return
                counts["sent"] += 1
            begin = time.perf_counter()
            decoding = post(url, sentences[number % len(sentences)])
            elapsed = time.perf_counter() - begin
            with lock:
                counts["errors" if decoding is None else "ok"] += 1
                if decoding is not None:
                    latencies.append(elapsed)
                    decode_seconds.append(decoding)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + REQUEST_TIMEOUT + 5)
    wall = time.perf_counter() - started
    return {"clients": clients, "requests": counts["sent"], "ok": counts["ok"],
            "errors": counts["errors"], "lost": counts["sent"] - counts["ok"] - counts["errors"],
            "seconds": round(wall, 2), "sentences_per_s": round(counts["ok"] / wall, 2),
            "p50_ms": round(1000 * percentile(latencies, 50), 1),
            "p95_ms": round(1000 * percentile(latencies, 95), 1),
            "p99_ms": round(1000 * percentile(latencies, 99), 1),
            # The server's own decoding time of the batches: latency minus this is queueing
            # and HTTP.
            "decode_p50_ms": round(1000 * percentile(decode_seconds, 50), 1),
            "decode_max_ms": round(1000 * max(decode_seconds, default=float("nan")), 1)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sentences = load_sentences(args)
    model_args = (["--run", args.run] if args.run else ["--checkpoint", args.checkpoint]
                  if args.checkpoint else ["--model", args.model])
    server = Server(model_args, args.serve_arg)
    try:
        # Warm-up, not counted: the first batches of a new size are slow (allocations).
        for size in (1, 8, 32):
            post(server.url, sentences[:size])
        levels = [run_level(server.url, sentences, clients, args.requests, args.seconds)
                  for clients in args.clients]
    finally:
        exit_status = server.stop()
    result = {"levels": levels, "server_exit_status": exit_status,
              "sentences": len(sentences), "serve_args": args.serve_arg}
    lowest = min(levels, key=lambda level: level["clients"])
    highest = max(levels, key=lambda level: level["clients"])
    if lowest["sentences_per_s"] > 0:
        result["throughput_ratio"] = round(highest["sentences_per_s"]
                                           / lowest["sentences_per_s"], 2)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'clients':>7} {'requests':>8} {'errors':>6} {'lost':>4} {'sents/s':>8} "
              f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
        for level in levels:
            print(f"{level['clients']:>7} {level['requests']:>8} {level['errors']:>6} "
                  f"{level['lost']:>4} {level['sentences_per_s']:>8} {level['p50_ms']:>8} "
                  f"{level['p95_ms']:>8} {level['p99_ms']:>8}")
        if "throughput_ratio" in result:
            print(f"throughput {highest['clients']} vs {lowest['clients']} clients: "
                  f"{result['throughput_ratio']}x; server exit status {exit_status}")
    failed = any(level["errors"] or level["lost"] for level in levels) or exit_status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
