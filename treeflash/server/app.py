"""The HTTP routes: OpenAI's /v1/models, /v1/completions, /v1/chat/completions and /v1/responses, plus /health,
/metrics and vLLM's /tokenize and /detokenize.

Every answer other than 200 carries OpenAI's error body. Requests are validated completely before the
engine sees them; a streamed call submits its requests when its stream starts and aborts them when
the stream ends early (the client went away), so an abandoned request frees its slot at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from treeflash.llm import LLM
from treeflash.server import protocol as p
from treeflash.server.engine_loop import EngineLoop, Event, RequestGroup, ShuttingDown, TokenLogprob
from treeflash.server.errors import APIError, bad_request, from_validation
from treeflash.server.frontend import Frontend, ServerConfig
from treeflash.server.metrics import CONTENT_TYPE, ServerMetrics
from treeflash.server.replies import ReplyReader
from treeflash.server.responses import (ResponsesRequest, ResponseStore, ResponseWriter, input_items,
                                        list_input_items, responses_param, to_chat)
from treeflash.tool_calls import ToolCall

_FIELDS = {name for model in (p.CompletionRequest, p.ChatCompletionRequest, p.ChatMessage, p.TextPart, p.StreamOptions,
                               p.MessageToolCall, p.FunctionCall, p.Tool, p.FunctionDefinition, p.NamedToolChoice,
                               p.TokenizeRequest, p.DetokenizeRequest, ResponsesRequest)
           for name in model.model_fields}


def build_app(llm: LLM, config: ServerConfig, engine_thread: bool = True) -> FastAPI:
    """The server's ASGI app; its lifespan starts and stops the engine loop (`app.state.engine_loop`).
    engine_thread: step the engine on a thread of its own; False: the caller steps it, calling
    `app.state.engine_loop.run()` on the thread that built the LLM (engine_loop.py says why)."""
    metrics = ServerMetrics(llm.max_num_seqs)
    loop = EngineLoop(llm.engine, metrics)
    frontend = Frontend(llm, config)
    # Tokenising and validating run here, one at a time (the frontend's tokenizer is one thread's), and off
    # the event loop: a megabyte prompt took seconds to tokenise, and every stream stalled meanwhile.
    frontend_thread = ThreadPoolExecutor(1, thread_name_prefix="treeflash-frontend")
    # Structures compile on a thread of their own (in a worker process), one at a time: a first json_object
    # takes seconds and a pathological pattern runs to its time limit, while other requests go on.
    structure_thread = ThreadPoolExecutor(1, thread_name_prefix="treeflash-structures")
    created = int(time.time())
    stored = ResponseStore(config.stored_responses)

    async def validated(make, body):
        return await asyncio.get_running_loop().run_in_executor(frontend_thread, make, body)

    async def validated_requests(make, body) -> tuple:
        """An endpoint's engine requests (and what goes with them), their structures compiled."""
        requests, extra = await validated(make, body)
        if any(r.params.structured_outputs is not None for r in requests):
            await asyncio.get_running_loop().run_in_executor(structure_thread, frontend.compile_structures,
                                                             requests, body)
        return requests, extra

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if engine_thread:
            loop.start()
        else:
            loop.attach(asyncio.get_running_loop())
        yield
        # Reached after uvicorn stopped taking connections and the in-flight ones ended (or timed out).
        await asyncio.to_thread(loop.stop)
        frontend_thread.shutdown(wait=False)
        structure_thread.shutdown(wait=False)

    app = FastAPI(title="treeflash", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine_loop, app.state.metrics = loop, metrics

    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:  # unknown route, wrong method
        return JSONResponse(APIError(error.status_code, str(error.detail)).body(), status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:  # a bug of ours: still OpenAI's body
        return JSONResponse(APIError(500, f"internal error: {type(error).__name__}: {error}",
                                     type="server_error").body(), status_code=500)

    async def authenticate(request: Request) -> None:
        if config.api_key is not None:
            _check_key(request.headers.get("authorization"), config.api_key)

    v1 = {"dependencies": [Depends(authenticate)]}

    @app.get("/health")
    async def health() -> Response:
        if not loop.alive or loop.closing:
            return JSONResponse(APIError(503, "the engine is not running", type="server_error").body(), 503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def card() -> dict:
        return p.ModelCard(id=config.model_name, created=created, max_model_len=llm.max_model_len).model_dump()

    @app.get("/v1/models", **v1)
    async def models() -> dict:
        return p.ModelList(data=[card()]).model_dump()

    @app.get("/v1/models/{name:path}", **v1)
    async def model(name: str) -> dict:
        frontend.check_model(name)
        return card()

    @app.post("/v1/completions", **v1)
    async def completions(request: Request) -> Response:
        body = await _parse(request, p.CompletionRequest, config.max_request_bytes)
        requests, echo = await validated_requests(frontend.completion_requests, body)
        fmt = _Formatter(config.model_name, chat=False, n=body.n, num_choices=len(requests),
                         include_usage=bool(body.stream_options and body.stream_options.include_usage),
                         echo=echo, prompt_logprobs=body.prompt_logprobs is not None)
        return await _respond(request, loop, requests, fmt, body.stream)

    @app.post("/v1/chat/completions", **v1)
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, p.ChatCompletionRequest, config.max_request_bytes)
        requests, reader = await validated_requests(frontend.chat_requests, body)
        chat = _Formatter(config.model_name, chat=True, n=body.n, num_choices=len(requests),
                          include_usage=bool(body.stream_options and body.stream_options.include_usage),
                          prompt_logprobs=body.prompt_logprobs is not None, reader=reader)
        return await _respond(request, loop, requests, chat, body.stream)

    @app.post("/v1/responses", **v1)
    async def create_response(request: Request) -> Response:
        body = await _parse(request, ResponsesRequest, config.max_request_bytes)
        turn = to_chat(body, stored)
        try:
            requests, reader = await validated_requests(frontend.chat_requests, turn.chat)
        except APIError as e:
            raise responses_param(e) from None
        writer = ResponseWriter(turn, requests[0].params, config.model_name, reader)

        def keep() -> None:
            if body.store and writer.status in ("completed", "incomplete"):
                stored.put(writer.response(), writer.conversation(), input_items(body))

        if body.stream:
            return StreamingResponse(_stream_response(loop, requests, writer, keep), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        answer = await _answer(request, loop, requests, lambda group: _whole_response(group, writer))
        keep()
        return answer

    @app.get("/v1/responses/{response_id}", **v1)
    async def get_response(response_id: str) -> dict:
        return stored.get(response_id)[0]

    @app.get("/v1/responses/{response_id}/input_items", **v1)
    async def get_input_items(response_id: str, limit: int = 20, order: str = "desc", after: str | None = None
                              ) -> dict:
        return list_input_items(stored.get(response_id)[2], limit, order, after)

    @app.delete("/v1/responses/{response_id}", **v1)
    async def delete_response(response_id: str) -> dict:
        stored.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    # vLLM's: the prompt token ids the endpoints would run (a completion prompt, or chat messages under the
    # template), and the text of token ids; behind the API key, as /v1 is.
    @app.post("/tokenize", dependencies=v1["dependencies"])
    async def tokenize(request: Request) -> dict:
        body = await _parse(request, p.TokenizeRequest, config.max_request_bytes)
        ids = await validated(frontend.tokenize, body)
        return p.TokenizeResponse(count=len(ids), max_model_len=llm.max_model_len, tokens=ids).model_dump()

    @app.post("/detokenize", dependencies=v1["dependencies"])
    async def detokenize(request: Request) -> dict:
        body = await _parse(request, p.DetokenizeRequest, config.max_request_bytes)
        return p.DetokenizeResponse(prompt=await validated(frontend.detokenize, body)).model_dump()

    return app


def _check_key(header: str | None, key: str) -> None:
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():  # the scheme is case-insensitive (RFC 7235)
        raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>'", code="invalid_api_key")
    if not hmac.compare_digest(given.strip().encode(), key.encode()):  # constant time
        raise APIError(401, "incorrect API key", code="invalid_api_key")


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to exceed `limit` bytes (a declared length is refused
    before reading; a chunked body is counted as it arrives), so a huge body costs no memory or parsing."""
    too_large = APIError(413, f"the request body exceeds {limit} bytes (the server's --max-request-bytes)",
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, model: type[BaseModel], limit: int):
    raw = await _read_body(request, limit)
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise bad_request("the body nests too deeply to parse", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation(e, _FIELDS) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


async def _respond(request: Request, loop: EngineLoop, requests, fmt: _Formatter, stream: bool) -> Response:
    if stream:
        # Submitted when the stream starts: a client gone before that leaves nothing behind.
        return StreamingResponse(_stream(loop, requests, fmt), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _answer(request, loop, requests, lambda group: _collect(group, fmt))


async def _answer(request: Request, loop: EngineLoop, requests, collect: Callable[[RequestGroup], Awaitable[dict]]
                  ) -> Response:
    """A non-streamed call's body (`collect` reads it from the requests' events), or 499 where the client went
    away first: its requests are then aborted."""
    group = _submit(loop, requests)
    task = asyncio.ensure_future(collect(group))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            return Response(status_code=499)  # nobody is there to read it
        return JSONResponse(task.result())
    finally:
        for pending in (task, gone):
            pending.cancel()
        loop.abort(group)  # a no-op once every choice has finished


def _submit(loop: EngineLoop, requests) -> RequestGroup:
    try:
        return loop.submit(requests)
    except ShuttingDown as e:
        raise APIError(503, str(e), type="server_error") from None


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next message is the client's disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(group: RequestGroup) -> AsyncIterator[Event]:
    """The group's events; the engine's failure or shutdown as the APIError a non-streamed call answers."""
    try:
        async for event in group.events():
            yield event
    except ShuttingDown as e:
        raise APIError(503, str(e), type="server_error") from None
    except Exception as e:  # noqa: BLE001 (the engine failed; the server goes on)
        raise APIError(500, f"the engine failed on this request: {e}", type="server_error") from None


async def _collect(group: RequestGroup, fmt: _Formatter) -> dict:
    texts, reasons, stops = [""] * fmt.num_choices, [None] * fmt.num_choices, [None] * fmt.num_choices
    logprobs: list[list | None] = [None] * fmt.num_choices
    usage = fmt.new_usage()
    async for event in _events(group):
        text, entries = fmt.with_echo(event)
        texts[event.index] += text
        if entries is not None:
            logprobs[event.index] = (logprobs[event.index] or []) + entries
        if event.finish_reason is not None:
            reasons[event.index], stops[event.index] = event.finish_reason, event.stop_reason
            fmt.count(usage, event)
    return fmt.final(texts, reasons, usage, logprobs, stops)


async def _whole_response(group: RequestGroup, writer: ResponseWriter) -> dict:
    """A response's body: its one request's events joined into one, which the writer reads at once."""
    text, entries, last = "", [], None
    async for last in _events(group):
        text += last.text
        entries += last.logprobs or []
    return writer.whole(dataclasses.replace(last, text=text, logprobs=entries))


async def _stream_response(loop: EngineLoop, requests, writer: ResponseWriter, keep: Callable[[], None]
                           ) -> AsyncIterator[str]:
    """A response's stream: Responses events (`event:` names the type), ended by response.completed or
    response.incomplete, or by error + response.failed; `keep` stores the finished response."""
    group = None
    try:
        group = _submit(loop, requests)
        for body in writer.start():
            yield _named_sse(body)
        async for event in group.events():
            for body in writer.feed(event):
                yield _named_sse(body)
        keep()
    except Exception as e:  # noqa: BLE001 (an engine failure or shutdown ends the stream with error events)
        error = e if isinstance(e, APIError) else APIError(503 if isinstance(e, ShuttingDown) else 500, str(e),
                                                             type="server_error")
        for body in writer.failed(error):
            yield _named_sse(body)
    finally:
        if group is not None:
            loop.abort(group)  # the client went away (or the stream failed): free the slot now


def _named_sse(body: dict) -> str:
    return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _stream(loop: EngineLoop, requests, fmt: _Formatter) -> AsyncIterator[str]:
    group = None
    try:
        group = _submit(loop, requests)
        for index in range(fmt.num_choices) if fmt.chat else ():
            yield fmt.sse(fmt.chunk(index, role=True))
        usage = fmt.new_usage()
        async for event in group.events():
            for chunk in fmt.event_chunks(event):
                yield fmt.sse(chunk)
            if event.finish_reason is not None:
                fmt.count(usage, event)
        if fmt.include_usage:
            yield fmt.sse(fmt.usage_chunk(usage))
    except APIError as e:
        yield fmt.sse(e.body())
    except Exception as e:  # noqa: BLE001 (an engine failure or shutdown ends this stream with an error event)
        yield fmt.sse(APIError(503 if isinstance(e, ShuttingDown) else 500, str(e), type="server_error").body())
    finally:
        if group is not None:
            loop.abort(group)  # the client went away (or the stream failed): free the slots now
    yield "data: [DONE]\n\n"


def _numbered(reader: ReplyReader, calls: list[ToolCall]) -> list[p.DeltaToolCall]:
    """The calls a choice's reader just completed, as stream deltas numbered in the choice's calls."""
    first = reader.calls - len(calls)
    return [p.DeltaToolCall(index=first + k, id=c.id, function=p.FunctionCallOut(name=c.name, arguments=c.arguments))
            for k, c in enumerate(calls)]


def _reason(reason: str | None, reader: ReplyReader) -> str | None:
    return "tool_calls" if reason == "stop" and reader.calls else reason  # (OpenAI's, for a reply that calls)


class _Formatter:
    """OpenAI response bodies and stream chunks for one call."""

    def __init__(self, model: str, chat: bool, n: int, num_choices: int, include_usage: bool,
                 echo: list[str] | None = None, prompt_logprobs: bool = False,
                 reader: Callable[[], ReplyReader] | None = None):
        self.model, self.chat, self.n, self.num_choices = model, chat, n, num_choices
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.offsets = [0] * num_choices  # completions' log-probs: characters of each choice's tokens so far
        self.echo = echo  # completions' echo: each choice's prompt text, which goes before its first text
        self.echoed = [False] * num_choices
        self.prompt_logprobs = prompt_logprobs  # vLLM's field asked for: the engine's entries go in the body
        self.prompt_entries: list[list | None] = [None] * num_choices
        self.reader = reader  # chat with tools or a reasoning parser: each choice's text is read for them
        self.readers = None if reader is None else [reader() for _ in range(num_choices)]

    def with_echo(self, event: Event) -> tuple[str, list[TokenLogprob] | None]:
        """The event's text and log-prob entries, the echoed prompt's in front at its choice's first event (its
        prompt's tokens' entries where log-probs are asked for); keeps the prompt's entries for the body."""
        if event.prompt is not None:
            self.prompt_entries[event.index] = event.prompt.entries
        if self.echo is None or self.echoed[event.index]:
            return event.text, event.logprobs
        self.echoed[event.index] = True
        entries = event.logprobs
        if entries is not None:
            entries = event.prompt.tokens + entries
        return self.echo[event.index] + event.text, entries

    def event_chunks(self, event: Event) -> list[dict]:
        """A stream's chunks for one engine event: its text (content, or the reasoning and tool calls read from
        it) and log-probs, then, where the choice finished, the chunk with its finish reason."""
        text, entries = self.with_echo(event)
        reason, calls, reasoning = event.finish_reason, [], ""
        if self.readers is not None:
            reader = self.readers[event.index]
            reasoning, text, done = reader.feed(text)
            calls = _numbered(reader, done)
            if reason is not None:
                more_reasoning, rest, done = reader.finish()
                reasoning, text, calls = reasoning + more_reasoning, text + rest, calls + _numbered(reader, done)
                reason = _reason(reason, reader)
        out = []
        if text or entries or calls or reasoning:
            out.append(self.chunk(event.index, text=text, logprobs=entries, tool_calls=calls, reasoning=reasoning))
        if reason is not None:
            out.append(self.chunk(event.index, finish_reason=reason, stop_reason=event.stop_reason))
        return out

    def _message(self, text: str, reason: str | None) -> tuple[p.AssistantMessage, str | None]:
        """A finished choice's message (its reasoning and tool calls read from the text, where asked) and finish
        reason."""
        if self.reader is None:
            return p.AssistantMessage(content=text), reason
        reader = self.reader()
        (reasoning, content, calls), (more_reasoning, rest, more) = reader.feed(text), reader.finish()
        calls = [p.ToolCallOut(id=c.id, function=p.FunctionCallOut(name=c.name, arguments=c.arguments))
                 for c in calls + more]
        reasoning = reasoning + more_reasoning or None
        return p.AssistantMessage(content=content + rest or (None if calls or reasoning else ""), tool_calls=calls,
                                  reasoning=reasoning, reasoning_content=reasoning), _reason(reason, reader)

    def _prompt_logprobs(self, index: int) -> list | None:
        """vLLM's prompt_logprobs of a choice: {token id: entry} per prompt token (None for the first)."""
        entries = self.prompt_entries[index]
        if not self.prompt_logprobs or entries is None:
            return None
        return [None if e is None else {t: p.PromptLogprob(logprob=lp.logprob, rank=lp.rank,
                                                           decoded_token=lp.decoded_token) for t, lp in e.items()}
                for e in entries]

    def new_usage(self) -> dict:
        return {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}

    def count(self, usage: dict, event: Event) -> None:
        if event.index % self.n == 0:  # a prompt counts once, however many choices it has
            usage["prompt_tokens"] += event.prompt_tokens
            usage["cached_tokens"] += event.cached_tokens
        usage["completion_tokens"] += event.completion_tokens

    def _usage(self, usage: dict) -> p.Usage:
        return p.Usage(prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"],
                       total_tokens=usage["prompt_tokens"] + usage["completion_tokens"],
                       prompt_tokens_details=p.PromptTokensDetails(cached_tokens=usage["cached_tokens"]))

    def final(self, texts: list[str], reasons: list[str | None], usage: dict, logprobs: list[list | None],
              stops: list[int | str | None]) -> dict:
        if self.chat:
            choices = [p.ChatChoice(index=i, message=message, finish_reason=reason, logprobs=self._logprobs(i, lp),
                                    stop_reason=s)
                       for i, (t, r, lp, s) in enumerate(zip(texts, reasons, logprobs, stops))
                       for message, reason in [self._message(t, r)]]
            body = p.ChatCompletion(id=self.id, created=self.created, model=self.model, choices=choices,
                                    usage=self._usage(usage), prompt_logprobs=self._prompt_logprobs(0))
        else:
            choices = [p.CompletionChoice(index=i, text=t, finish_reason=r, logprobs=self._logprobs(i, lp),
                                          stop_reason=s, prompt_logprobs=self._prompt_logprobs(i))
                       for i, (t, r, lp, s) in enumerate(zip(texts, reasons, logprobs, stops))]
            body = p.Completion(id=self.id, created=self.created, model=self.model, choices=choices,
                                usage=self._usage(usage))
        return body.model_dump()

    def _logprobs(self, index: int, entries: list[TokenLogprob] | None):
        """OpenAI's logprobs object of a choice's tokens (None where none were asked for): chat's content list,
        or the completions endpoint's parallel lists, whose text offsets go on from the choice's last ones."""
        if entries is None:
            return None
        if self.chat:
            return p.ChatLogprobs(content=[p.ChatTokenLogprob(
                token=e.token, logprob=e.logprob, bytes=e.bytes,
                top_logprobs=[p.TopLogprob(token=t, logprob=lp, bytes=b) for t, lp, b in e.top]) for e in entries])
        offsets = []
        for e in entries:
            offsets.append(self.offsets[index])
            self.offsets[index] += len(e.token)
        # (vLLM's dict: the most likely tokens and the generated one; tokens of equal text share a key)
        tops = [None if e.logprob is None else {t: lp for t, lp, _ in e.top} | {e.token: e.logprob}
                for e in entries]  # (None: an echoed prompt's first token, as the token's log-prob)
        return p.CompletionLogprobs(text_offset=offsets, token_logprobs=[e.logprob for e in entries],
                                    tokens=[e.token for e in entries], top_logprobs=tops)

    def chunk(self, index: int, text: str = "", role: bool = False, finish_reason: str | None = None,
              logprobs: list[TokenLogprob] | None = None, stop_reason: int | str | None = None,
              tool_calls: list[p.DeltaToolCall] = (), reasoning: str = "") -> dict:
        if self.chat:
            delta = p.Delta(role="assistant", content="") if role else p.Delta(content=text) if text else p.Delta()
            if logprobs and not text and not role:
                delta = p.Delta(content="")  # (tokens whose text is still held back: their entries go now)
            if tool_calls:
                delta.tool_calls = list(tool_calls)
            if reasoning:
                delta.reasoning = delta.reasoning_content = reasoning
            choice = p.ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason)
            body = p.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])
        else:
            choice = p.CompletionChoice(index=index, text=text, finish_reason=finish_reason)
            body = p.Completion(id=self.id, created=self.created, model=self.model, choices=[choice])
        out = body.model_dump(exclude_none=True)
        out["choices"][0].update(logprobs=self._logprobs(index, logprobs).model_dump() if logprobs else None,
                                 finish_reason=finish_reason)
        if finish_reason is not None:
            out["choices"][0]["stop_reason"] = stop_reason
        if self.include_usage:
            out["usage"] = None  # OpenAI's convention: every chunk but the last has usage null
        return out

    def usage_chunk(self, usage: dict) -> dict:
        cls = p.ChatCompletionChunk if self.chat else p.Completion
        return cls(id=self.id, created=self.created, model=self.model, choices=[],
                   usage=self._usage(usage)).model_dump()

    @staticmethod
    def sse(body: dict) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"
