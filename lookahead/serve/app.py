"""The FastAPI app: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`, with `/health` and
`/metrics`. Requests are checked here (`schemas`), turned into `Row`s (one per choice) and handed to the `Engine`;
its events come back through an asyncio queue per request, as one JSON response or as server-sent events.

Streaming is OpenAI's: `data: {chunk}\\n\\n` per chunk, then `data: [DONE]\\n\\n`; a client that disconnects cancels
its rows, which leave the batch before its next step.
"""
from __future__ import annotations

import asyncio
import difflib
import json
import time
import uuid
from functools import partial

import numpy as np
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ..decode.loop import token_ids
from ..model.facts import tree_refusal
from .row import Row, Sampling
from .schemas import BadRequest, Request, parse_body, parse_request

COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
SERVER_ERROR = {"error": {"message": "The server failed while decoding this request (its log says why); other "
                                     "requests go on.", "type": "server_error", "param": None, "code": None}}


class Served:
    """What the app serves: the model's name, its tokenizer and limits, the engine, the metrics.

    Args:
        name: the model id clients name (`/v1/models`).
        tokenizer: the model's tokenizer.
        engine: the running `Engine`.
        metrics: its `Metrics`.
        max_tokens: the default most new tokens of a chat request without max_tokens (cut to the context left).
    """

    def __init__(self, name: str, tokenizer, engine, metrics, max_tokens: int = 256):
        self.name, self.tokenizer, self.engine, self.metrics = name, tokenizer, engine, metrics
        self.max_tokens, self.created = max_tokens, int(time.time())
        facts, config = engine.facts, engine.model.generation_config
        self.limit, self.vocab = engine.limit, facts.vocab
        self.eos = token_ids(config.eos_token_id) or token_ids(tokenizer.eos_token_id)

    def prompt_ids(self, req: Request) -> np.ndarray:
        """The prompt's token ids: the chat template over the messages (without one: the contents, a line each),
        or the completion prompt's text or ids."""
        tok = self.tokenizer
        if req.chat:
            return chat_ids(tok, req.messages)
        if isinstance(req.prompt, str):
            return np.asarray(tok(req.prompt)["input_ids"], dtype=np.int64)
        ids = np.asarray(req.prompt, dtype=np.int64)
        if ids.max() >= self.vocab:
            raise BadRequest(f"Invalid 'prompt': token id {int(ids.max())} is outside the vocabulary of "
                             f"{self.vocab} tokens.", "prompt", "invalid_value")
        return ids

    def max_new(self, req: Request, prompt: int) -> int:
        """The most new tokens of a request with a prompt of `prompt` tokens.

        Raises:
            BadRequest: the prompt, or the prompt and max_tokens, do not fit the model's context."""
        field = "messages" if req.chat else "prompt"
        if self.limit is not None and prompt >= self.limit:
            raise BadRequest(f"This model's maximum context length is {self.limit} tokens. However, your "
                             f"{field} has {prompt} tokens.", field, "context_length_exceeded")
        left = None if self.limit is None else self.limit - prompt
        if req.max_tokens is None:
            default = self.max_tokens if req.chat else COMPLETIONS_MAX_TOKENS
            return default if left is None else min(default, left)
        if left is not None and req.max_tokens > left:
            name = "max_completion_tokens" if req.chat else "max_tokens"
            raise BadRequest(f"This model's maximum context length is {self.limit} tokens. However, you requested "
                             f"{prompt + req.max_tokens} tokens ({prompt} in the {field}, {req.max_tokens} for the "
                             f"completion).", name, "context_length_exceeded")
        return req.max_tokens


def chat_text(messages: list) -> str:
    """A conversation as plain text, for a model without a chat template: each message's content on its line."""
    return "\n".join(m["content"] for m in messages)


def chat_ids(tokenizer, messages: list) -> np.ndarray:
    """The prompt ids of a conversation as the server makes them: the tokenizer's chat template with the generation
    prompt, or without one the contents, a line each (`chat_text`)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    return np.asarray(tokenizer(chat_text(messages))["input_ids"], dtype=np.int64)


def make_app(served: Served) -> FastAPI:
    """The server's FastAPI app over `served`."""
    app = FastAPI(title="lookahead serve")
    app.state.served = served

    @app.exception_handler(BadRequest)
    async def bad_request(request: HTTPRequest, error: BadRequest):
        served.metrics.requests.labels(request.url.path, str(error.status)).inc()
        return JSONResponse(error.body(), status_code=error.status)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await _complete(served, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await _complete(served, request, chat=False)

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "lookahead"}]}

    @app.get("/health")
    async def health():
        if served.engine.error is not None:
            return JSONResponse({"status": "error", "error": str(served.engine.error)}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(served.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return app


async def _complete(served: Served, request: HTTPRequest, chat: bool):
    req = parse_request(parse_body(await request.body()), chat)
    if req.model != served.name:
        raise BadRequest(f"The model '{req.model}' does not exist; this server serves '{served.name}'.", "model",
                         "model_not_found")
    prompt = served.prompt_ids(req)
    max_new = served.max_new(req, len(prompt))
    refusal = tree_refusal(served.engine.facts) if req.drafting.draft == "tree" else None
    if refusal is not None:
        raise BadRequest(f"Invalid 'lookahead.draft': 'tree' is not supported for {served.engine.facts.name}: "
                         f"{refusal}; use 'chain'.", "lookahead.draft", "invalid_value")
    prediction = None
    if req.prediction:
        prediction = np.asarray(served.tokenizer(req.prediction, add_special_tokens=False)["input_ids"],
                                dtype=np.int64)
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    rows = []
    for j in range(req.n):
        s = req.sampling
        sampling = Sampling(s.temperature, s.top_p, None if s.seed is None else (s.seed + j) % 2**63)
        rows.append(Row(prompt, max_new, served.eos, sampling, req.drafting, served.tokenizer, req.stops, prediction,
                        emit=partial(_post, loop, events, j), stream=req.stream))
    try:
        for row in rows:
            served.engine.submit(row)
    except RuntimeError as error:
        return JSONResponse({"error": {"message": str(error), "type": "server_error", "param": None, "code": None}},
                            status_code=503)
    reply = Reply(served, req, rows, len(prompt))
    endpoint = request.url.path
    if req.stream:
        served.metrics.requests.labels(endpoint, "200").inc()
        return StreamingResponse(_stream(served, reply, events), media_type="text/event-stream")
    waiter = asyncio.ensure_future(_collect(events, req.n))
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, watcher):
            task.cancel()
        _cancel(served, rows)
    if waiter not in done:  # the client went away: its rows were cancelled above
        served.metrics.requests.labels(endpoint, "499").inc()
        return Response(status_code=499)
    if any(row.finish == "error" for row in rows):
        served.metrics.requests.labels(endpoint, "500").inc()
        return JSONResponse(SERVER_ERROR, status_code=500)
    served.metrics.requests.labels(endpoint, "200").inc()
    return reply.whole()


def _post(loop, events: asyncio.Queue, choice: int, event: tuple) -> None:
    """Hand an engine event to the request's queue (called in the engine's thread)."""
    try:
        loop.call_soon_threadsafe(events.put_nowait, (choice, event))
    except RuntimeError:  # the event loop is closed: the server is stopping
        pass


async def _collect(events: asyncio.Queue, n: int) -> None:
    done = 0
    while done < n:
        _, (kind, _) = await events.get()
        done += kind == "done"


async def _disconnected(request: HTTPRequest) -> None:
    """Return when the client disconnects (the body has been read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _cancel(served: Served, rows: list) -> None:
    for row in rows:
        if not row.done:
            served.engine.cancel(row)


async def _stream(served: Served, reply: "Reply", events: asyncio.Queue):
    """The server-sent events of a streamed request; cancels its rows when the client goes away."""
    try:
        if reply.req.chat:
            for j in range(reply.req.n):
                yield _sse(reply.chunk(j, role=True))
        done = 0
        while done < reply.req.n:
            j, (kind, value) = await events.get()
            if kind == "text":
                yield _sse(reply.chunk(j, text=value))
            elif value == "error":
                yield _sse(SERVER_ERROR)
                return
            else:
                done += 1
                yield _sse(reply.chunk(j, finish=_finish(value)))
        if reply.req.include_usage:
            yield _sse(reply.usage_chunk())
        yield "data: [DONE]\n\n"
    finally:
        _cancel(served, reply.rows)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _finish(reason: str) -> str:
    return "stop" if reason == "cancelled" else reason


def predicted_in(prediction, out: list) -> int:
    """How many of the prediction's tokens appear in the answer `out`, in order (the longest common subsequence's
    blocks, as a diff finds them)."""
    if prediction is None or not len(prediction) or not out:
        return 0
    blocks = difflib.SequenceMatcher(None, [int(t) for t in prediction], list(out), autojunk=False)
    return sum(block.size for block in blocks.get_matching_blocks())


class Reply:
    """The OpenAI response objects of one request: the whole response, or its stream's chunks."""

    def __init__(self, served: Served, req: Request, rows: list, prompt_tokens: int):
        self.served, self.req, self.rows, self.prompt_tokens = served, req, rows, prompt_tokens
        self.id = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if req.chat else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.served.name,
                "system_fingerprint": None}

    def usage(self) -> dict:
        """OpenAI's usage; `completion_tokens_details` counts as OpenAI does: the prediction's tokens that appear in
        each answer (in order, `predicted_in`) are accepted, the rest rejected, however they were drafted.
        `lookahead`: every draft token verified and accepted, the draft tokens that came from the prediction
        (accepted and rejected by the target), and the forwards (row forwards summed over the choices, the prefill
        included)."""
        c = [row.stats for row in self.rows]
        completion = sum(len(row.out) for row in self.rows)
        accepted = sum(predicted_in(row.prediction, row.out) for row in self.rows)
        predicted = sum(len(row.prediction) for row in self.rows if row.prediction is not None)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
                "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                              "rejected_prediction_tokens": predicted - accepted,
                                              "reasoning_tokens": 0},
                "lookahead": {"draft_tokens": sum(x.draft_tokens for x in c),
                              "accepted_tokens": sum(x.accepted_tokens for x in c),
                              "prediction_drafted": sum(x.prediction_accepted + x.prediction_rejected for x in c),
                              "prediction_accepted": sum(x.prediction_accepted for x in c),
                              "forwards": sum(x.forward_passes for x in c)}}

    def whole(self) -> dict:
        choices = []
        for j, row in enumerate(self.rows):
            finish = _finish(row.finish)
            if self.req.chat:
                choices.append({"index": j, "message": {"role": "assistant", "content": row.text.text,
                                                        "refusal": None}, "logprobs": None, "finish_reason": finish})
            else:
                choices.append({"index": j, "text": row.text.text, "logprobs": None, "finish_reason": finish})
        return {**self._head(self.object), "choices": choices, "usage": self.usage()}

    def chunk(self, j: int, text: str | None = None, finish: str | None = None, role: bool = False) -> dict:
        if self.req.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choice = {"index": j, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice, obj = {"index": j, "text": text or "", "logprobs": None, "finish_reason": finish}, "text_completion"
        out = {**self._head(obj), "choices": [choice]}
        if self.req.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self) -> dict:
        obj = "chat.completion.chunk" if self.req.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage()}
