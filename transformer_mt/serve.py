"""`tmt serve`: one process that loads a model once and translates over HTTP (FastAPI + uvicorn).

    POST /translate   {"text": "..." | ["...", ...], "beam": 4, "nbest": 2, ...}
    POST /attention   {"text": "one sentence"}: the translation and its cross-attention weights
    GET  /health      model, step, device
    GET  /            the web page (transformer_mt/static/index.html); /?q=... translates at once
    GET  /docs        FastAPI's OpenAPI page

Dynamic batching: requests that arrive within `batch_wait_ms` of each other are decoded as one
length-sorted batch (Translator.search sorts it) in a single worker thread, so the event loop
stays free to accept requests while the model works, and concurrent clients share the
throughput of batched decoding. Requests with different decoding options are decoded in
separate batches; a seeded sampling request always alone (its draws must not depend on
strangers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterator, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from . import __version__
from .errors import TmtError
from .loading import LoadedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeLimits:
    max_sentences: int = 64          # per request
    max_chars: int = 20_000          # per request, all sentences together
    batch_wait_ms: float = 5.0       # how long the first request of a batch waits for others
    max_batch_sentences: int = 256   # per decoding batch


class TranslateRequest(BaseModel):
    """Decoding options left out take the model's decode settings (its config.yaml)."""
    model_config = ConfigDict(extra="forbid")

    text: Union[str, list[str]]
    beam: int | None = Field(None, ge=1, le=32)
    nbest: int = Field(1, ge=1, le=32)
    length_penalty: float | None = Field(None, ge=0, le=10, allow_inf_nan=False)
    max_len_a: float | None = Field(None, ge=0, le=10, allow_inf_nan=False)
    max_len_b: int | None = Field(None, ge=1, le=1024)
    sample_topk: int | None = Field(None, ge=0, le=1000)
    temperature: float | None = Field(None, gt=0, le=100, allow_inf_nan=False)
    seed: int | None = None


class AttentionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class DecodeKey:
    """The decoding options of a request: requests with equal keys share a batch."""
    beam: int
    nbest: int
    changes: tuple[tuple[str, Any], ...]      # decode settings that differ from the model's
    seed: int | None
    alone: int = 0                             # nonzero: never merged with another request


@dataclass
class Job:
    sentences: list[str]
    key: DecodeKey
    future: asyncio.Future


class Batcher:
    """Gathers concurrent requests for a few milliseconds and decodes them together."""

    def __init__(self, loaded: LoadedModel, limits: ServeLimits):
        self.translator = loaded.translator
        self.limits = limits
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        # One worker: the model is used by one batch at a time, in a thread of its own.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tmt-decode")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.executor.shutdown(wait=True)

    async def translate(self, sentences: list[str], key: DecodeKey) -> dict:
        job = Job(sentences, key, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.future

    async def run_alone(self, function, *args):
        """Run `function` in the decoding thread, between batches (the model is not shared)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _gather(self) -> list[Job]:
        jobs = [await self.queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.batch_wait_ms / 1000
        count = len(jobs[0].sentences)
        while count < self.limits.max_batch_sentences:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            jobs.append(job)
            count += len(job.sentences)
        return jobs

    async def _run(self) -> None:
        while True:
            jobs = await self._gather()
            groups: dict[DecodeKey, list[Job]] = defaultdict(list)
            for job in jobs:
                groups[job.key].append(job)
            for key, group in groups.items():
                await self._decode_group(key, group)

    async def _decode_group(self, key: DecodeKey, group: list[Job]) -> None:
        sentences = [s for job in group for s in job.sentences]
        loop = asyncio.get_running_loop()
        try:
            outputs, seconds = await loop.run_in_executor(self.executor, self._decode,
                                                          sentences, key)
        except Exception as exc:  # a decoding failure answers its requests; the server lives on
            log.exception("decoding failed")
            for job in group:
                if not job.future.done():
                    job.future.set_exception(RequestError(500, f"decoding failed: {exc}"))
            return
        start = 0
        for job in group:
            if not job.future.done():              # the client may have gone away
                job.future.set_result({"outputs": outputs[start:start + len(job.sentences)],
                                       "seconds": seconds, "batch_sentences": len(sentences)})
            start += len(job.sentences)

    def _decode(self, sentences: list[str], key: DecodeKey
                ) -> tuple[list[list[tuple[str, float]]], float]:
        started = time.perf_counter()
        translator = self.translator
        if key.changes or key.seed is not None or key.beam != translator.decode_cfg.beam_size:
            translator = translator.with_decoding(seed=key.seed, beam_size=key.beam,
                                                  **dict(key.changes))
        if key.nbest > 1:
            outputs = translator.translate_nbest(sentences, key.nbest)
        else:
            outputs = [[(text, float("nan"))] for text in translator.translate(sentences)]
        return outputs, time.perf_counter() - started


def _decode_key(request: TranslateRequest, loaded: LoadedModel, serial: int) -> DecodeKey:
    decode = loaded.translator.decode_cfg
    changes = {name: getattr(request, name)
               for name in ("length_penalty", "max_len_a", "max_len_b", "sample_topk",
                            "temperature")
               if getattr(request, name) is not None and getattr(request, name) != getattr(
                   decode, name)}
    sampling = (request.sample_topk if request.sample_topk is not None else decode.sample_topk)
    beam = request.beam if request.beam is not None else decode.beam_size
    if sampling:
        if (request.beam or 1) > 1 or request.nbest > 1:
            raise RequestError(422, "sample_topk samples one translation: it cannot be "
                               "combined with beam > 1 or nbest > 1")
        beam = 1
    seed_alone = serial if request.seed is not None else 0
    return DecodeKey(max(beam, request.nbest), request.nbest, tuple(sorted(changes.items())),
                     request.seed, seed_alone)


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def create_app(loaded: LoadedModel, limits: ServeLimits = ServeLimits()) -> FastAPI:
    batcher = Batcher(loaded, limits)
    serial = iter(range(1, sys.maxsize))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="tmt translation server", version=__version__, lifespan=lifespan,
                  description="English→Italian translation with a model trained by tmt.")
    page = resources.files(__package__).joinpath("static/index.html").read_text("utf-8")

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get(
            "msg", "invalid request")
        if first.get("type") == "model_attributes_type":     # not a JSON object at all
            message = "the body must be a JSON object, sent as Content-Type: application/json"
        return _error(422, f"invalid request: {message}", detail=jsonable(exc.errors()))

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": loaded.identity(),
                "device": str(loaded.translator.device), "step": loaded.step,
                "attention": loaded.translator.model is not None}

    @app.post("/translate")
    async def translate(request: TranslateRequest) -> dict:
        sentences = [request.text] if isinstance(request.text, str) else request.text
        if not sentences:
            raise RequestError(422, "text: give at least one sentence")
        if len(sentences) > limits.max_sentences:
            raise RequestError(413, f"{len(sentences)} sentences in one request; the limit is "
                               f"{limits.max_sentences} (tmt serve --max-sentences)")
        chars = sum(len(s) for s in sentences)
        if chars > limits.max_chars:
            raise RequestError(413, f"{chars} characters in one request; the limit is "
                               f"{limits.max_chars} (tmt serve --max-chars)")
        key = _decode_key(request, loaded, next(serial))
        result = await batcher.translate(sentences, key)
        answer = {"translations": [hyps[0][0] for hyps in result["outputs"]],
                  "model": loaded.identity(),
                  "decoding": {"beam": key.beam, "nbest": key.nbest, **dict(key.changes)},
                  "seconds": round(result["seconds"], 4),
                  "batch_sentences": result["batch_sentences"]}
        if key.nbest > 1:
            answer["nbest"] = [[{"text": text, "score": round(score, 4)} for text, score in hyps]
                               for hyps in result["outputs"]]
        return answer

    @app.post("/attention")
    async def attention(request: AttentionRequest) -> dict:
        if loaded.translator.model is None:
            raise RequestError(501, "attention weights need the PyTorch model; this server "
                               "runs a CTranslate2 export")
        if len(request.text) > limits.max_chars:
            raise RequestError(413, f"{len(request.text)} characters; the limit is "
                               f"{limits.max_chars} (tmt serve --max-chars)")
        from .attention_plot import cross_attention

        try:
            alignment = await batcher.run_alone(cross_attention, loaded.translator,
                                                request.text)
        except TmtError as exc:
            raise RequestError(422, str(exc)) from None
        return {"source_tokens": alignment.src_tokens, "target_tokens": alignment.tgt_tokens,
                "weights": [[round(float(w), 4) for w in row] for row in alignment.weights]}

    return app


def jsonable(errors: list[dict]) -> list[dict]:
    """Pydantic's error list without its non-JSON parts (exceptions in 'ctx')."""
    return [{k: v for k, v in error.items() if k in ("type", "loc", "msg")} for error in errors]


@contextlib.contextmanager
def _quiet_exit_signals() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the
    handlers it found: these make that a normal exit (status 0) instead of a kill."""
    previous = {sig: signal.signal(sig, lambda *_: None)
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(loaded: LoadedModel, host: str, port: int, limits: ServeLimits,
          access_log: bool = False) -> None:
    """Serve until SIGTERM or Ctrl-C: then stop accepting, finish the requests in flight, and
    return. Port 0 picks a free port; the address is printed on stderr once it listens."""
    import uvicorn

    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        # Listening now: connections made before uvicorn starts wait in the backlog.
        sock.listen(2048)
    except OSError as exc:
        raise TmtError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(loaded, limits), log_level="warning",
                            access_log=access_log, timeout_graceful_shutdown=60)
    server = uvicorn.Server(config)
    shown_host = f"[{host}]" if ":" in host else host
    print(f"tmt: listening on http://{shown_host}:{bound_port}/ (API docs at /docs); Ctrl-C or "
          f"SIGTERM stops", file=sys.stderr, flush=True)
    with _quiet_exit_signals():
        server.run(sockets=[sock])
    print("tmt: server stopped", file=sys.stderr)
