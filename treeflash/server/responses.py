"""OpenAI's Responses API (`POST /v1/responses`) on the chat endpoint's machinery.

A response request is translated into a chat request (`to_chat`: `instructions` as the system message,
`input` items as messages, function tools and `text.format` in chat's shapes), validated and run as one,
and its reply is read with the same reader (reasoning, tool calls) into Responses output items:
`reasoning`, `message` and `function_call`. `ResponseWriter` turns the engine's events into the
Responses stream (`response.created` ... `response.completed`, each event numbered); a whole response is
the same writer fed the whole reply at once, so a streamed and a plain response cannot differ.

Stored responses (`store`, the default) live in this process's memory, at most `ResponseStore.capacity`
of them, so that `previous_response_id` can continue a conversation and `GET /v1/responses/{id}` can
return one; a restart forgets them.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError

from treeflash.sampling import SamplingParams
from treeflash.server.engine_loop import Event, TokenLogprob
from treeflash.server.errors import APIError, bad_request
from treeflash.server.protocol import UNSUPPORTED, ChatCompletionRequest, _Request
from treeflash.server.replies import ReplyReader
from treeflash.tool_calls import ToolCall

LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for the message's log-probs
# The chat request's fields a response request may also carry (vLLM's sampling extensions and the chat
# template's arguments): passed through as they came. The chat endpoint's UNSUPPORTED ones pass too, so that
# they are refused by name there.
PASSED = {"top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "logit_bias", "min_tokens", "allowed_token_ids", "bad_words",
          "include_stop_str_in_output", "skip_special_tokens", "truncate_prompt_tokens", "chat_template_kwargs",
          "add_generation_prompt", "continue_final_message", "documents", "structured_outputs", "guided_json",
          "guided_regex", "guided_choice", "guided_whitespace_pattern", *UNSUPPORTED}
# A chat field named in a 400, as the response request names it.
FIELD_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
               "response_format": "text", "logprobs": "include", "reasoning_effort": "reasoning"}
TEXT_PARTS = {"input_text", "output_text", "text"}


class ResponsesRequest(_Request):
    """The body of POST /v1/responses (OpenAI's fields this server honours, and those it accepts as no-ops)."""

    model_config = ConfigDict(extra="allow")  # (vLLM's sampling extensions, in `model_extra`: see PASSED)

    model: str | None = None
    input: str | list[dict] = Field(min_length=1)
    instructions: str | None = None  # the system message; not carried on by previous_response_id
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = None
    include: list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None  # (include_obfuscation: nothing here is obfuscated)
    store: bool = True
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    text: dict | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Accepted at the values that change nothing; refused otherwise (`to_chat`)
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    reasoning: dict | None = None
    conversation: str | dict | None = None
    prompt: dict | None = None


@dataclass
class Turn:
    """A response request as the chat endpoint runs it, and the conversation it continues."""

    body: ResponsesRequest
    chat: ChatCompletionRequest
    history: list[dict]  # the conversation's messages before this turn's output, without the instructions
    text_format: dict = field(default_factory=lambda: {"type": "text"})


class ResponseStore:
    """Finished responses kept for `previous_response_id`, GET /v1/responses/{id} and its input items: the
    newest `capacity`, each as (response, conversation after it as chat messages, its input items)."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict, list[dict], list[dict]]] = OrderedDict()

    def put(self, response: dict, conversation: list[dict], inputs: list[dict]) -> None:
        self._items[response["id"]] = (response, conversation, inputs)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> tuple[dict, list[dict], list[dict]]:
        found = self._items.get(response_id)
        if found is None:
            raise APIError(404, f"no stored response has the id {response_id!r} (responses are kept in the server's "
                                f"memory, the newest {self.capacity}, and only with store: true)",
                           param=param, code="not_found")
        return found

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._items[response_id]


_ITEM_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def input_items(body: ResponsesRequest) -> list[dict]:
    """A request's input as the items GET /v1/responses/{id}/input_items lists: a string input as one user
    message; each item as given, with its type where implied (a role: a message), text content as parts
    (input_text; output_text for the assistant's), and an id where it had none."""
    given = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    items = []
    for item in given:
        item = _copy(item)
        kind = item.setdefault("type", "message")
        if kind == "message":
            if isinstance(item.get("content"), str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": item["content"]}]
            item.setdefault("status", "completed")
        item.setdefault("id", _new_id(_ITEM_ID_PREFIXES.get(kind, "item")))
        items.append(item)
    return items


def list_input_items(items: list[dict], limit: int = 20, order: str = "desc", after: str | None = None) -> dict:
    """One page of a stored response's input items, as OpenAI lists them: `order` "desc" (the default) newest
    first; `after` the id of the item the page starts after, in that order."""
    if not 1 <= limit <= 100:
        raise bad_request(f"limit must be between 1 and 100, got {limit}", param="limit")
    if order not in ("asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc', got {order!r}", param="order")
    ordered = items[::-1] if order == "desc" else list(items)
    ids = [item["id"] for item in ordered]
    if after is not None and after not in ids:
        raise APIError(404, f"this response has no input item with the id {after!r}", param="after",
                       code="not_found")
    start = 0 if after is None else ids.index(after) + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + len(page) < len(ordered)}


def to_chat(body: ResponsesRequest, store: ResponseStore) -> Turn:
    """The chat request that runs `body`, or the 400 (404: an unknown previous_response_id) that says why not."""
    _refuse_unsupported(body)
    history = list(store.get(body.previous_response_id, "previous_response_id")[1]) \
        if body.previous_response_id is not None else []
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    history += _messages(items)
    chat: dict = {"model": body.model, "messages": ([{"role": "system", "content": body.instructions}]
                                                    if body.instructions is not None else []) + history,
                  "temperature": body.temperature, "top_p": body.top_p,
                  "max_completion_tokens": body.max_output_tokens, "parallel_tool_calls": body.parallel_tool_calls}
    if body.tools:
        chat["tools"] = [_chat_tool(t, i) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(body.tool_choice)
    if (body.reasoning or {}).get("effort") is not None:
        chat["reasoning_effort"] = body.reasoning["effort"]
    text_format = _text_format(body.text)
    if text_format["type"] == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif text_format["type"] == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": text_format.get("name"),
                                                                          "schema": text_format["schema"]}}
    if LOGPROBS in (body.include or []) or (body.top_logprobs or 0) > 0:
        chat["logprobs"], chat["top_logprobs"] = True, body.top_logprobs or 0
    chat |= {name: value for name, value in (body.model_extra or {}).items() if name in PASSED}
    try:
        return Turn(body, ChatCompletionRequest.model_validate(chat), history, text_format)
    except ValidationError as e:  # (a field's value chat refuses: a tool_choice string, a tool's name, ...)
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        field = FIELD_NAMES.get(str(first["loc"][0]), str(first["loc"][0]))
        raise bad_request(f"{field}: {first['msg'].removeprefix('Value error, ')} ({where} of the chat request it "
                          f"makes)", param=field) from None


def responses_param(error: APIError) -> APIError:
    """A 4xx of the chat endpoint with the field it names as the response request names it."""
    if error.param is not None:
        head = error.param.split("[", 1)[0].split(".", 1)[0]
        error.param = FIELD_NAMES.get(head, error.param if head == error.param else head)
        if head == "messages":  # (numbered as the chat request's: the instructions, the earlier turns, the input)
            error.message = re.sub(r"^messages\[", "input, as chat message [", error.message)
    return error


def _refuse_unsupported(body: ResponsesRequest) -> None:
    def refuse(name: str, why: str) -> None:
        raise bad_request(f"{name}: {why}", param=name, code="unsupported")

    if body.background:
        refuse("background", "background responses are not supported (send the request and wait, or stream it)")
    if body.truncation == "auto":
        refuse("truncation", "'auto' is not supported: a conversation longer than the context gets a 400")
    if body.reasoning and any(v is not None for k, v in body.reasoning.items() if k != "effort"):
        refuse("reasoning", "reasoning summaries are not supported (a reasoning model's thinking comes back as "
                            "a reasoning item where the server runs a --reasoning-parser); effort is, where "
                            "the chat template reads it")
    if body.conversation is not None:
        refuse("conversation", "conversations are not supported; continue one with previous_response_id")
    if body.prompt is not None:
        refuse("prompt", "stored prompt templates are not supported")
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise bad_request(f"top_logprobs must be in [0, 20], got {body.top_logprobs}", param="top_logprobs")


def _messages(items: list) -> list[dict]:
    """Input items as chat messages: messages, function calls (on the assistant message before them) and
    their outputs (tool messages); a reasoning item's text goes with the assistant message after it (the
    chat template shows it again or not: Qwen3's and GPT-OSS's do inside a tool loop)."""
    out: list[dict] = []
    reasoning = None  # a reasoning item's text, for the next assistant message
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where}: an input item must be an object", param="input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}.role must be user, system, developer or assistant, got {role!r}",
                                  param="input")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
            if out and out[-1]["role"] == "assistant" and reasoning is None:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                        "content": output if isinstance(output, str) else _text(output, f"{where}.output")})
        elif kind == "reasoning":
            parts = item.get("content") or []
            texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "reasoning_text"] \
                if isinstance(parts, list) else [None]
            if not all(isinstance(t, str) for t in texts):
                raise bad_request(f"{where}.content must be a list of reasoning_text parts", param="input")
            reasoning = "\n".join(texts) if texts else None  # (a summary alone is not the model's text)
            continue
        else:
            raise bad_request(f"{where}: input items of type {kind!r} are not supported (messages, function_call, "
                              f"function_call_output and reasoning are)", param="input", code="unsupported")
        if reasoning is not None and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"] = reasoning
        reasoning = None
    return out


def _text(content, where: str) -> str:
    """A message's text: a string, or its text parts on lines of their own (as the chat endpoint joins them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", param="input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise bad_request(f"{where}[{j}]: content parts of type {kind!r} are not supported (this server reads "
                              f"text: input_text, output_text)", param="input", code="unsupported")
    return "\n".join(texts)


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise bad_request(f"{where}.{key} must be a non-empty string", param="input")
    return value


def _chat_tool(tool, i: int) -> dict:
    """A Responses function tool ({type, name, parameters, ...}) as chat's ({type, function: {...}})."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise bad_request(f"tools[{i}]: tools of type {kind!r} are not supported (only function tools: OpenAI's "
                          f"hosted tools run on OpenAI's servers)", param="tools", code="unsupported")
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _chat_tool_choice(choice):
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise bad_request("tool_choice must be none, auto, required or {'type': 'function', 'name': ...}",
                              param="tool_choice", code="unsupported")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _text_format(text: dict | None) -> dict:
    form = (text or {}).get("format") or {"type": "text"}
    kind = form.get("type") if isinstance(form, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise bad_request(f"text.format type must be text, json_object or json_schema, got {kind!r}", param="text")
    if kind == "json_schema" and not isinstance(form.get("schema"), dict):
        raise bad_request("text.format json_schema needs schema, a JSON schema object", param="text")
    return form


# --- output ---------------------------------------------------------------------------------------
def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _logprob(entry: TokenLogprob) -> dict:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": entry.bytes,
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, lp, b in entry.top]}


class ResponseWriter:
    """One response's output items and stream events, from the engine's events of its one request.

    Items open as their text arrives (reasoning, then the message) and close when another kind begins or
    the reply ends; a tool call comes whole, as the reader completes it. Text of whitespace alone is held
    until more follows, so that the line breaks between a reply's calls open no message. The message's
    log-probs are those of every token generated up to its end, its reasoning's included (a call's after it
    have no message to go to)."""

    def __init__(self, turn: Turn, params: SamplingParams, model: str, reader: Callable[[], ReplyReader] | None):
        self.turn, self.params, self.model = turn, params, model
        self.reader = reader() if reader is not None else None
        self.logprobs = turn.chat.logprobs is True
        self.id, self.created = _new_id("resp"), int(time.time())
        self.output: list[dict] = []  # items, each dict updated in place while it is open
        self.open: dict | None = None  # the reasoning or message item text goes into now
        self.held, self.entries = "", []  # whitespace not yet placed; log-probs not yet sent
        self.sequence = 0
        self.status, self.usage, self.incomplete = "in_progress", None, None

    # --- events -----------------------------------------------------------------------------------
    def start(self) -> list[dict]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def feed(self, event: Event) -> list[dict]:
        """The stream events for one engine event (the last one's close the items and the response)."""
        if event.logprobs and self.logprobs:
            self.entries += event.logprobs
        if self.reader is None:
            reasoning, content, calls = "", event.text, []
        else:
            reasoning, content, calls = self.reader.feed(event.text)
        out = []
        if event.finish_reason is not None and self.reader is not None:
            more_reasoning, rest, more = self.reader.finish()
            reasoning, content, calls = reasoning + more_reasoning, content + rest, calls + more
        if reasoning:
            out += self._reasoning(reasoning)
        if content:
            out += self._content(content)
        for call in calls:
            out += self._call(call)
        if event.finish_reason is not None:
            out += self._finish(event)
        return out

    def whole(self, event: Event) -> dict:
        """The finished response of a reply given at once (`event`: its whole text, entries and end)."""
        self.start()
        self.feed(event)
        return self.response()

    def failed(self, error: APIError) -> list[dict]:
        self.status = "failed"
        return [self._event("error", code=error.code or error.type, message=error.message, param=error.param),
                self._event("response.failed", response=self.response() | {
                    "error": {"code": "server_error", "message": error.message}})]

    # --- items ------------------------------------------------------------------------------------
    def _reasoning(self, text: str) -> list[dict]:
        out = self._open("reasoning") if self.open is None or self.open["type"] != "reasoning" else []
        self._part()["text"] += text
        return out + [self._event("response.reasoning_text.delta", **self._where(), delta=text)]

    def _content(self, text: str) -> list[dict]:
        out = []
        if self.open is None or self.open["type"] != "message":
            if not (self.held + text).strip():
                self.held += text
                return []
            text, self.held = self.held + text, ""
            out = self._open("message")
        part, entries, self.entries = self._part(), [_logprob(e) for e in self.entries], []
        part["text"] += text
        part["logprobs"] += entries
        return out + [self._event("response.output_text.delta", **self._where(), delta=text, logprobs=entries)]

    def _open(self, kind: str) -> list[dict]:
        """Close the open item and open a reasoning or message item, of one empty content part."""
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            item = {"type": "reasoning", "id": _new_id("rs"), "summary": [], "status": "in_progress", "content": [part]}
        else:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item = {"type": "message", "id": _new_id("msg"), "status": "in_progress", "role": "assistant",
                    "content": [part]}
        out = self._close() + self._add(item)
        return out + [self._event("response.content_part.added", **self._where(), part=part)]

    def _call(self, call: ToolCall) -> list[dict]:
        out = self._close()
        item = {"type": "function_call", "id": _new_id("fc"), "call_id": call.id, "name": call.name,
                "arguments": "", "status": "in_progress"}
        out += self._add(item)
        item["arguments"] = call.arguments
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        out += [self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
                self._event("response.function_call_arguments.done", **where, arguments=call.arguments)]
        item["status"] = "completed"
        self.open = None
        return out + [self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _add(self, item: dict) -> list[dict]:
        self.output.append(item)
        self.open = item
        return [self._event("response.output_item.added", output_index=len(self.output) - 1, item=item)]

    def _close(self, status: str = "completed") -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": self.output.index(item), "content_index": 0}
        part = item["content"][0]
        if item["type"] == "message":
            if self.entries:  # (tokens whose text was held back to the end)
                part["logprobs"] += [_logprob(e) for e in self.entries]
                self.entries = []
            done = self._event("response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"])
        else:
            done = self._event("response.reasoning_text.done", **where, text=part["text"])
        item["status"] = status
        return [done, self._event("response.content_part.done", **where, part=part),
                self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _finish(self, event: Event) -> list[dict]:
        truncated = event.finish_reason == "length"
        out = []
        if not self.output or self.held and not any(i["type"] in ("message", "function_call") for i in self.output):
            out = self._open("message")  # (a reply of no text, or of whitespace alone, is still a message)
            out += self._content(self.held) if self.held else []
        out += self._close("incomplete" if truncated else "completed")
        self.status = "incomplete" if truncated else "completed"
        self.incomplete = {"reason": "max_output_tokens"} if truncated else None
        self.usage = {"input_tokens": event.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": event.cached_tokens},
                      "output_tokens": event.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": 0},  # (not counted: see docs/serving.md)
                      "total_tokens": event.prompt_tokens + event.completion_tokens}
        return out + [self._event(f"response.{self.status}", response=self.response())]

    def _part(self) -> dict:
        return self.open["content"][0]

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output) - 1, "content_index": 0}

    def _event(self, kind: str, **fields) -> dict:
        self.sequence += 1
        return {"type": kind, **_copy(fields), "sequence_number": self.sequence - 1}  # (items grow later)

    # --- the response -----------------------------------------------------------------------------
    def response(self) -> dict:
        body = self.turn.body
        text = {"format": self.turn.text_format}
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": self.status,
            "error": None, "incomplete_details": self.incomplete, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "model": self.model, "output": _copy(self.output),
            "parallel_tool_calls": body.parallel_tool_calls, "previous_response_id": body.previous_response_id,
            "temperature": self.params.temperature, "top_p": self.params.top_p, "top_logprobs": body.top_logprobs,
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto", "tools": body.tools or [],
            "text": text, "truncation": "disabled", "background": False, "reasoning": None, "store": body.store,
            "metadata": body.metadata or {}, "user": body.user, "usage": self.usage,
            "completed_at": int(time.time()) if self.status in ("completed", "incomplete") else None}

    def conversation(self) -> list[dict]:
        """The conversation after this response, as chat messages, for a later previous_response_id: its
        history, then the reply's reasoning, text and calls as one assistant message."""
        text = "".join(i["content"][0]["text"] for i in self.output if i["type"] == "message")
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.output if i["type"] == "function_call"]
        reply = {"role": "assistant", "content": text if text or not calls else None}
        reasoning = "".join(i["content"][0]["text"] for i in self.output if i["type"] == "reasoning")
        if reasoning:
            reply["reasoning_content"] = reasoning
        return self.turn.history + [reply | ({"tool_calls": calls} if calls else {})]


def _copy(value):
    """A deep copy of JSON-shaped data."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
