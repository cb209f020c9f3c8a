"""`tmt serve` end to end: a real server process on a free loopback port, answers compared with
the same model translating in this process, each error with its status code, concurrent
clients, and a graceful shutdown with requests in flight."""

from __future__ import annotations

import http.client
import json
import math
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import uvicorn
from server_process import JsonClient, TmtServer

from transformer_mt.config import DecodeConfig
from transformer_mt.loading import LoadedModel
from transformer_mt.serve import ServeLimits, create_app
from transformer_mt.translator import Translator

SENTENCES = ["I love reading books.", "Where is the station?", "Tom is my friend.",
             "We are hungry.", "The cat sleeps.", "Open the door, please.", "I don't know.",
             "She said hello."]


@pytest.fixture(scope="module")
def translator(varied_model: Path) -> Translator:
    return Translator.from_checkpoint(varied_model, "cpu")


@pytest.fixture(scope="module")
def server(varied_model: Path):
    served = TmtServer("--checkpoint", str(varied_model), "--device", "cpu",
                       "--max-sentences", "8", "--max-chars", "400", "--batch-wait-ms", "30")
    yield served
    assert served.terminate() == 0, served.stderr


def test_health_names_the_model(server, varied_model):
    status, health = server.request("/health")
    assert status == 200 and health["status"] == "ok"
    assert health["model"]["checkpoint"] == str(varied_model)
    assert health["model"]["run"] == "run" and health["step"] == 6
    assert health["device"] == "cpu"


def test_answers_equal_the_offline_translator(server, translator):
    one = server.translate(text=SENTENCES[0])
    assert one["translations"] == translator.translate(SENTENCES[:1])
    assert one["model"]["step"] == 6 and one["seconds"] >= 0
    batch = server.translate(text=SENTENCES)
    assert batch["translations"] == translator.translate(SENTENCES)
    assert len(set(batch["translations"])) > 1, "the model cannot tell sentences apart"
    beam = server.translate(text=SENTENCES, beam=3)
    assert beam["translations"] == translator.with_decoding(beam_size=3).translate(SENTENCES)


def test_decoding_options_are_applied(server, translator):
    capped = server.translate(text=SENTENCES, max_len_a=0, max_len_b=2)
    expected = translator.with_decoding(max_len_a=0.0, max_len_b=2).translate(SENTENCES)
    assert capped["translations"] == expected
    assert all(len(translator.tgt_codec.encode(t)) <= 2 for t in capped["translations"])
    assert capped["decoding"]["max_len_b"] == 2
    sampled = [server.translate(text=SENTENCES, sample_topk=5, seed=7)["translations"]
               for _ in range(2)]
    assert sampled[0] == sampled[1], "a seeded sample must repeat"


def test_nbest_lists_distinct_translations_best_first(server):
    answer = server.translate(text=SENTENCES[:3], beam=4, nbest=3)
    assert len(answer["nbest"]) == 3
    for best, hyps in zip(answer["translations"], answer["nbest"]):
        texts, scores = [h["text"] for h in hyps], [h["score"] for h in hyps]
        assert 1 <= len(hyps) <= 3 and len(set(texts)) == len(texts)
        assert texts[0] == best and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("body, status, words", [
    ({"text": ["x"] * 9}, 413, "9 sentences"),
    ({"text": "a" * 401}, 413, "401 characters"),
    ({"text": []}, 422, "at least one sentence"),
    ({"text": "hi", "colour": "red"}, 422, "colour"),
    ({"sentence": "hi"}, 422, "text"),
    ({"text": 5}, 422, "text"),
    ({"text": "hi", "beam": 0}, 422, "beam"),
    ({"text": "hi", "beam": 2, "sample_topk": 5}, 422, "sample_topk"),
    ({"text": "hi", "temperature": 0}, 422, "temperature"),
])
def test_bad_requests_get_a_clear_json_error(server, body, status, words):
    code, answer = server.request("/translate", body)
    assert code == status and words in answer["error"], answer


def test_malformed_json_and_wrong_content_type(server):
    code, answer = server.request("/translate", raw=b'{"text": "unterminated')
    assert code == 422 and "JSON" in answer["error"]
    code, answer = server.request("/translate", raw=b"text=hi",
                                  content_type="application/x-www-form-urlencoded")
    assert code == 422 and "application/json" in answer["error"]


def test_concurrent_clients_get_their_own_answers_in_shared_batches(server, translator):
    expected = {s: t for s, t in zip(SENTENCES, translator.translate(SENTENCES))}
    requests = [SENTENCES[i % 8:i % 8 + 1 + i % 3] for i in range(24)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda text: server.translate(text=text), requests))
    for text, answer in zip(requests, answers):
        assert answer["translations"] == [expected[s] for s in text]
    # Some request was decoded together with another one (dynamic batching happened).
    assert any(a["batch_sentences"] > len(t) for t, a in zip(requests, answers))


def test_web_page_and_api_docs_are_served(server):
    status, page = server.request("/")
    assert status == 200 and 'id="translation"' in page and "/translate" in page
    status, docs = server.request("/docs")
    assert status == 200 and "swagger" in docs.lower()
    status, attention = server.request("/attention", {"text": SENTENCES[0]})
    assert status == 200
    rows = attention["weights"]
    assert len(rows) == len(attention["target_tokens"])
    assert all(len(r) == len(attention["source_tokens"]) for r in rows)
    assert all(math.isclose(sum(r), 1.0, abs_tol=1e-2) for r in rows)


def test_sigterm_finishes_the_requests_in_flight_then_exits_0(varied_model):
    # A long batching wait keeps the requests queued in the server when SIGTERM arrives.
    served = TmtServer("--checkpoint", str(varied_model), "--device", "cpu",
                       "--batch-wait-ms", "1500")
    host, port = served.url.removeprefix("http://").split(":")
    connections = []
    try:
        for sentence in SENTENCES[:4]:
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            connection.request("POST", "/translate", json.dumps({"text": sentence}),
                               {"Content-Type": "application/json"})
            connections.append(connection)
        time.sleep(0.5)                 # the server has read them: they wait for their batch
        served.process.send_signal(signal.SIGTERM)
        answers = [c.getresponse() for c in connections]
        statuses = [a.status for a in answers]
        translations = [json.loads(a.read())["translations"] for a in answers]
        code = served.terminate()
    finally:
        served.kill()
    assert code == 0, served.stderr
    assert statuses == [200] * 4 and all(len(t) == 1 for t in translations)
    assert "Traceback" not in served.stderr and "server stopped" in served.stderr


# --------------------------------------------------------------------------- in-process

class _FailingTranslator:
    """Fails on the sentence "boom", echoes anything else in capitals."""
    decode_cfg = DecodeConfig()
    device = "cpu"
    model = None

    def translate(self, sentences):
        if "boom" in sentences:
            raise RuntimeError("out of memory")
        return [s.upper() for s in sentences]


def test_a_decoding_failure_answers_500_and_the_server_lives_on():
    """The app of `tmt serve` over real HTTP, in this process, with a translator that fails."""
    loaded = LoadedModel(_FailingTranslator(), Path("x.pt"), 1, "pytorch", None)
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(loaded, ServeLimits(batch_wait_ms=1)),
                                           log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        client = JsonClient(f"http://127.0.0.1:{sock.getsockname()[1]}")
        failed = client.request("/translate", {"text": ["fine", "boom"]})
        after = client.request("/translate", {"text": "fine"})
    finally:
        server.should_exit = True
        thread.join(30)
    assert failed[0] == 500 and "decoding failed: out of memory" in failed[1]["error"]
    assert after == (200, after[1]) and after[1]["translations"] == ["FINE"]
