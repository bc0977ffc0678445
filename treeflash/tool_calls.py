"""Tool calls in a model's reply, read from the text it generated (the Hermes format).

Models whose chat template shows them tools (Qwen2.5, Qwen3, Hermes and their kin) are trained to answer a
call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call. Reading changes
nothing that is generated: the tokens are the model's, as with any other request, and the reply's text is
split afterwards into the content (whatever lies outside the blocks, stripped) and the calls. Where a call
is forced (OpenAI's tool_choice "required", or a named function), `call_structure` gives the structured
output that holds the reply to call blocks (treeflash/structured.py).

A block ends at the first `</tool_call>` outside a JSON string, so an argument may hold the closing tag
itself (code that writes tool calls, say). Where the block ends depends only on the text before it, which
keeps the streamed split (`ToolCallStream`) equal to the whole text's (`parse_tool_calls`), block by block.
A block whose JSON is not a call (no name, arguments not an object, not JSON) stays in the content as the
model wrote it, and so does a block the reply ends inside (a length cut, or a string never closed):
nothing is dropped.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from treeflash.structured import StructuredOutputsParams

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_QUOTE_OR_CLOSE = re.compile(r'"|' + re.escape(CLOSE))
_STRING_END = re.compile(r'\\.|"', re.S)  # an escape (skipped whole) or the closing quote


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's API carries it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])


def template_writes_tool_calls(template: str | None) -> bool:
    """Whether a chat template teaches the Hermes format (the one this module reads)."""
    return OPEN in str(template or "")


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """A finished reply's content (None where nothing but calls was said) and its tool calls, in order."""
    content, calls = _split(text, final=True)
    content = content.strip()
    return content or None, calls


class ToolCallStream:
    """The same split as `parse_tool_calls`, as text arrives: `feed` returns the content that is certain
    now and the calls completed since the last feed; `finish` returns what was held back.

    Held back until it is certain: a tail that may begin a block (`<tool_`), a block not closed yet, and
    whitespace that may turn out to end the content (the finished content is stripped).
    """

    def __init__(self, parallel: bool = True):
        self.parallel = parallel  # False: the first call only (OpenAI's parallel_tool_calls)
        self.text, self.sent, self.calls = "", 0, 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.text += text
        content, calls = _split(self.text, final=False)
        return self._new(content.lstrip().rstrip(), calls)

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = _split(self.text, final=True)
        return self._new(content.strip(), calls)

    def _new(self, content: str, calls: list[ToolCall]) -> tuple[str, list[ToolCall]]:
        if not self.parallel:
            calls = calls[:1]
        delta, self.sent = content[self.sent:], max(self.sent, len(content))
        new, self.calls = calls[self.calls:], len(calls)
        return delta, new


def call_structure(tools: list[dict], name: str | None = None, several: bool = False) -> StructuredOutputsParams:
    """The structure of a reply that is a call (OpenAI's tool_choice "required", or naming `name`): a block
    calling one of the tools with arguments to its parameters' schema; `several`: one or more blocks."""
    from outlines_core.json_schema import build_regex_from_schema

    calls = [{"type": "object", "required": ["name", "arguments"],
              "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}}}
             for f in (t["function"] for t in tools) if name is None or f["name"] == name]
    try:
        call = build_regex_from_schema(json.dumps({"anyOf": calls}))
    except Exception as e:  # noqa: BLE001 (a parameters schema outlines-core cannot translate)
        raise ValueError(f"the tools' parameters cannot be held to: {e}") from None
    block = f"{OPEN}\n{call}\n{CLOSE}"
    return StructuredOutputsParams(regex=block + (f"(\n{block})*" if several else ""))


def _split(text: str, final: bool) -> tuple[str, list[ToolCall]]:
    """The text outside the well-formed blocks (malformed ones kept whole) and the blocks' calls; unless
    `final`, without an open block or a tail that may still become one."""
    content, calls, pos = [], [], 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            tail = text[pos:]
            content.append(tail if final else tail[:len(tail) - _tag_prefix(tail)])
            return "".join(content), calls
        content.append(text[pos:start])
        end = _block_end(text, start + len(OPEN))
        if end < 0:  # the reply stops inside a block: not a call
            if final:
                content.append(text[start:])
            return "".join(content), calls
        call = _call(text[start + len(OPEN):end])
        if call is None:
            content.append(text[start:end + len(CLOSE)])
        else:
            calls.append(call)
        pos = end + len(CLOSE)


def _block_end(text: str, pos: int) -> int:
    """Where the first CLOSE outside a JSON string lies at or after `pos`, or -1 where none does yet."""
    while True:
        m = _QUOTE_OR_CLOSE.search(text, pos)
        if m is None:
            return -1
        if m.group() == CLOSE:
            return m.start()
        pos = m.end()
        while (m := _STRING_END.search(text, pos)) is not None and m.group() != '"':
            pos = m.end()
        if m is None:
            return -1
        pos = m.end()


def _tag_prefix(tail: str) -> int:
    """Length of the longest end of `tail` that begins OPEN (and may become it)."""
    for k in range(min(len(tail), len(OPEN) - 1), 0, -1):
        if tail.endswith(OPEN[:k]):
            return k
    return 0


def _call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))  # (some models write "parameters")
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))
