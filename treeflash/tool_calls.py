"""Tool calls in a model's reply, read from the text it generated, in the format its chat template teaches.

Five formats, by vLLM's parser names:
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call (Qwen2.5,
  Qwen3, Hermes and their kin). Text outside the blocks is content.
- `qwen3_coder`: one `<tool_call>` block per call as well, holding XML, `<function=NAME>` and in it one
  `<parameter=KEY>` element per argument, its value raw text between newlines (Qwen3-Coder). A value is
  read as its parameter's type in the request's tool schema says (integer, number, boolean, object, array;
  text where the schema says string or nothing, or the text is no such value), so a reader of this format
  is made for a request's tools (`for_tools`). A forced call follows the template's layout (parameters in
  the schema's order, the required ones present, each value JSON of its schema or any text).
- `llama3_json`: the whole reply is `{"name": ..., "parameters": {...}}`, calls joined by `;` where there
  are several (Llama 3.1, 3.2 and 3.3; `<|python_tag|>` first, where special tokens are kept). A reply that
  is anything else is content, as a whole.
- `mistral`: `[TOOL_CALLS]` and then a JSON list of calls (`[{"name": ..., "arguments": {...}}]`, Mistral
  7B v0.3, Nemo) or one `name[ARGS]{...}` per `[TOOL_CALLS]` (newer Mistral templates); text before the
  first `[TOOL_CALLS]` is content. `[TOOL_CALLS]` is a special token, so a request with tools keeps
  special tokens in its text, and ids are 9 letters and digits, as Mistral's templates require of them. A
  forced call is the JSON list alone: a structure's text never holds a special token (vLLM does the same).
- `openai`: GPT-OSS's harmony messages addressed to a function, `<|start|>assistant<|channel|>commentary
  to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`, read with `--reasoning-parser openai_gptoss`,
  whose reader hands such a message on whole (treeflash/reasoning.py); every other message's text is
  content or reasoning there. `<|call|>` stops GPT-OSS's generation (it is among its EOS ids), so it is
  not in the text: a reply that ends inside a call's body is a call where the body is a whole JSON object.
  A call cannot be forced: its header is special tokens, which a structure's text never holds.

Reading changes nothing that is generated: the tokens are the model's, as with any other request, and the
reply's text is split afterwards into the content (stripped) and the calls. Where a call is forced
(OpenAI's tool_choice "required", or a named function), `call_structure` gives the structured output that
holds the reply to calls (treeflash/structured.py).

Nothing is dropped: a block or reply that is not a well-formed call (no name, arguments not an object, not
JSON, cut by a length limit) stays in the content as the model wrote it. A Hermes block ends at the first
`</tool_call>` outside a JSON string, so an argument may hold the closing tag itself (code that writes tool
calls, say). What is content depends only on the text before it, which keeps the streamed split
(`ToolCallStream`) equal to the whole text's (`parse_tool_calls`): a Hermes or Qwen3-Coder call streams as
soon as its block closes, a harmony call once its message ends; Llama 3's and Mistral's formats say whether
a reply calls only once it ends, so their calls (and a reply that turns out to be text after all) come at
the end.
"""

from __future__ import annotations

import json
import random
import re
import string
import uuid
from dataclasses import dataclass, field

from treeflash.reasoning import MESSAGE as HARMONY_MESSAGE
from treeflash.reasoning import MESSAGE_ENDS as HARMONY_ENDS
from treeflash.reasoning import START as HARMONY_START
from treeflash.reasoning import harmony_function
from treeflash.structured import StructuredOutputsParams

OPEN, CLOSE = "<tool_call>", "</tool_call>"  # Hermes
PYTHON_TAG = "<|python_tag|>"  # Llama 3's, before a call, where special tokens are kept
MISTRAL_CALLS = "[TOOL_CALLS]"
HARMONY_CALL = "<|call|>"  # (the end of a GPT-OSS call, in its chat template alone)
_QUOTE_OR_CLOSE = re.compile(r'"|' + re.escape(CLOSE))
_STRING_END = re.compile(r'\\.|"', re.S)  # an escape (skipped whole) or the closing quote
_MISTRAL_NAMED = re.compile(r"([^\s\[\]{}]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]")  # name[ARGS]{...}
_SPACE = re.compile(r"\s*")
_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's API carries it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])


class ToolCallFormat:
    """How a family of chat templates asks the model to write calls: how to read them out of a reply, and
    the pattern a forced call follows."""

    name: str
    keeps_special_tokens = False  # whether its calls' markup is a special token (kept in the text then)
    can_force = True  # whether a reply can be held to calls (`forced_pattern`)
    arguments_key = "arguments"  # the key a forced call writes its arguments under

    def split(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        """The text that is content (markup of malformed calls kept) and the calls; unless `final`, only what
        is certain whatever text comes next."""
        raise NotImplementedError

    def forced_pattern(self, functions: list[dict], several: bool) -> str:
        """The regex of a reply of one call (or with `several`, one or more) of one of `functions` (OpenAI's
        function definitions), its arguments held to the function's parameters schema."""
        from outlines_core.json_schema import build_regex_from_schema

        key = self.arguments_key
        calls = [{"type": "object", "required": ["name", key],
                  "properties": {"name": {"const": f["name"]}, key: f.get("parameters") or {"type": "object"}}}
                 for f in functions]
        try:
            call = build_regex_from_schema(json.dumps({"anyOf": calls}))
        except Exception as e:  # noqa: BLE001 (a parameters schema outlines-core cannot translate)
            raise ValueError(f"the tools' parameters cannot be held to: {e}") from None
        return self.calls_pattern(call, several)

    def calls_pattern(self, call: str, several: bool) -> str:
        """The regex of a reply of one call (or with `several`, one or more) whose JSON object matches `call`."""
        raise NotImplementedError

    def new_call(self, name: str, arguments: dict) -> ToolCall:
        return ToolCall(name, json.dumps(arguments, ensure_ascii=False))

    def for_tools(self, tools: list[dict] | None) -> "ToolCallFormat":
        """This format's reader for a request offering `tools` (OpenAI's, {"type": "function", "function":
        {...}}); the same one where the format reads calls without them."""
        return self

    def forced(self) -> "ToolCallFormat":
        """The reader of a reply held to `forced_pattern`: the same one where that pattern writes the format's
        own markup."""
        return self

    def __repr__(self) -> str:
        return self.name


class Hermes(ToolCallFormat):
    name = "hermes"

    def split(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        return _split_blocks(text, final, OPEN, self._block)

    def _block(self, text: str, start: int, final: bool) -> tuple[int, ToolCall | None] | None:
        end = self._end(text, start + len(OPEN))
        if end < 0:  # (the reply stops inside a block: not a call)
            return None
        return end + len(CLOSE), self._call(text[start + len(OPEN):end])

    @staticmethod
    def _end(text: str, pos: int) -> int:
        return _block_end(text, pos)

    def _call(self, body: str) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        return _call_of(self, obj)

    def calls_pattern(self, call: str, several: bool) -> str:
        block = f"{OPEN}\n{call}\n{CLOSE}"
        return block + (f"(\n{block})*" if several else "")


class QwenXml(Hermes):
    """Qwen3-Coder's: `<tool_call>`, `<function=NAME>`, `<parameter=KEY>` value `</parameter>` per argument,
    `</function>`, `</tool_call>`, newlines between them (the template writes one after each opening tag and
    before each closing one: a value loses one at each end, no more)."""

    name = "qwen3_coder"

    def __init__(self, schemas: dict[str, dict] | None = None):
        self.schemas = schemas or {}  # function name -> its parameters' properties (JSON schema per parameter)

    def for_tools(self, tools: list[dict] | None) -> "QwenXml":
        functions = [t.get("function", t) for t in tools or []]
        return QwenXml({f["name"]: (f.get("parameters") or {}).get("properties") or {} for f in functions
                        if isinstance(f, dict) and isinstance(f.get("name"), str)})

    @staticmethod
    def _end(text: str, pos: int) -> int:
        """Where the block's CLOSE lies: after its parameters, each ending at its first `</parameter>` (so a
        value may hold `</tool_call>`, as a forced call's may); -1 where the reply has not got there yet.
        A block laid out otherwise ends at its first CLOSE (and is no call)."""
        head = _XML_HEAD.match(text, pos)
        if head is None:
            return text.find(CLOSE, pos)
        pos = head.end()
        while True:
            pos = _SPACE.match(text, pos).end()
            if text.startswith("<parameter=", pos):
                pos = text.find("</parameter>", pos)
                if pos < 0:
                    return -1
                pos += len("</parameter>")
                continue
            tail = _XML_TAIL.match(text, pos)
            if tail is not None:
                return tail.start(1)
            return text.find(CLOSE, pos) if len(text) - pos >= len("</function>") else -1

    def _call(self, body: str) -> ToolCall | None:
        function = _XML_FUNCTION.fullmatch(body)
        if function is None:
            return None
        name, inner, properties = function.group(1), function.group(2), self.schemas.get(function.group(1), {})
        arguments, pos = {}, 0
        for parameter in _XML_PARAMETER.finditer(inner):
            if inner[pos:parameter.start()].strip():
                return None  # text between parameters: not this format
            key, value = parameter.group(1), parameter.group(2)
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            arguments[key] = _typed(value, properties.get(key))
            pos = parameter.end()
        if inner[pos:].strip():
            return None
        return self.new_call(name, arguments)

    def forced_pattern(self, functions: list[dict], several: bool) -> str:
        """Calls as the template writes them: each function's parameters in its schema's order, the required
        ones present; a value JSON of its parameter's schema, or where that names a string or nothing, any
        text without `</parameter>`."""
        from outlines_core.json_schema import build_regex_from_schema

        blocks = []
        for f in functions:
            parameters = f.get("parameters") or {}
            required = set(parameters.get("required") or [])
            elements = []
            for key, schema in (parameters.get("properties") or {}).items():
                kinds = _schema_types(schema)
                try:
                    value = (_avoiding("</parameter>") if "string" in kinds or not kinds
                             else build_regex_from_schema(json.dumps(schema)))
                except Exception as e:  # noqa: BLE001 (a parameter schema outlines-core cannot translate)
                    raise ValueError(f"the tools' parameters cannot be held to: {e}") from None
                element = f"(<parameter={re.escape(key)}>\n{value}\n</parameter>\n)"
                elements.append(element if key in required else element + "?")
            blocks.append(f"{OPEN}\n<function={re.escape(f['name'])}>\n{''.join(elements)}</function>\n{CLOSE}")
        block = "(" + "|".join(blocks) + ")"
        return block + (f"(\n{block})*" if several else "")


def _avoiding(word: str) -> str:
    """The regex of every text without `word` in it (no lookahead: outlines-core builds automata of regexes).
    `word`'s first character must not recur in it: a text is then one without that character, or where each
    of its runs is followed by a proper prefix of the rest of `word` and a character that breaks it."""
    first, rest = word[0], word[1:]
    esc = re.escape

    def cls(*chars: str) -> str:
        return "[^" + "".join("\\" + c if c in "]\\^-" else c for c in chars) + "]"

    back = "|".join(esc(rest[:i] + first) for i in range(len(rest)))  # a prefix, then the first again
    out = "|".join(esc(rest[:i]) + cls(first, rest[i]) for i in range(len(rest)))  # a prefix, then a break
    partial = "|".join(esc(rest[:i]) for i in range(1, len(rest)))
    loop = f"(?:{cls(first)}|{esc(first)}(?:{back})*(?:{out}))*"
    return f"{loop}(?:{esc(first)}(?:{back})*(?:{partial})?)?"


_XML_HEAD = re.compile(r"\s*<function=[^>\n]+>")
_XML_TAIL = re.compile(r"</function>\s*(</tool_call>)")
_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _schema_types(schema) -> list:
    """The JSON types a parameter's schema names (its "type", one or a list), none where it names none."""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    return [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []


def _typed(value: str, schema) -> object:
    """A raw parameter value as the JSON value its schema's type names; the text itself where the schema
    names a string or nothing, or the text is not a value of that type."""
    kinds = _schema_types(schema)
    if "string" in kinds or not kinds:
        return value
    if value.strip() == "null" and "null" in kinds:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    accepts = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
               "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               "boolean": lambda v: isinstance(v, bool), "object": lambda v: isinstance(v, dict),
               "array": lambda v: isinstance(v, list), "null": lambda v: v is None}
    return parsed if any(accepts.get(k, lambda v: False)(parsed) for k in kinds) else value


class Llama3Json(ToolCallFormat):
    name = "llama3_json"
    arguments_key = "parameters"  # (what Llama 3's templates ask for; "arguments" is read too)

    def split(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
            if not final and not body:
                return "", []
        elif not final and PYTHON_TAG.startswith(body):  # (nothing but blanks yet, or the tag's beginning)
            return "", []
        if not body.startswith("{"):
            return text, []
        if not final:  # a call, or text that begins like one: said at the end
            return "", []
        calls = self._calls(body)
        return ("", calls) if calls is not None else (text, [])

    def _calls(self, body: str) -> list[ToolCall] | None:
        """The calls of a body that is nothing but calls joined by `;`, else None."""
        calls, pos = [], 0
        while True:
            try:
                obj, pos = _JSON.raw_decode(body, pos)
            except ValueError:
                return None
            if (call := _call_of(self, obj)) is None:
                return None
            calls.append(call)
            pos = _SPACE.match(body, pos).end()
            if pos < len(body) and body[pos] == ";":
                pos = _SPACE.match(body, pos + 1).end()
            elif pos < len(body):
                return None
            if pos == len(body):
                return calls

    def calls_pattern(self, call: str, several: bool) -> str:
        return call + (f"(; {call})*" if several else "")


class Mistral(ToolCallFormat):
    name = "mistral"
    keeps_special_tokens = True

    def split(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        start = text.find(MISTRAL_CALLS)
        if start < 0:
            return (text if final else text[:len(text) - _tag_prefix(text, MISTRAL_CALLS)]), []
        if not final:  # calls, or text that begins like them: said at the end
            return text[:start], []
        calls = self._calls(text, start)
        return (text[:start], calls) if calls else (text, [])

    def _calls(self, text: str, pos: int) -> list[ToolCall] | None:
        """The calls from `pos` to the end, each list or call after a [TOOL_CALLS], else None."""
        calls = []
        while pos < len(text):
            if not text.startswith(MISTRAL_CALLS, pos):
                return None
            pos = _SPACE.match(text, pos + len(MISTRAL_CALLS)).end()
            named = _MISTRAL_NAMED.match(text, pos)
            try:
                if named is None:  # a JSON list of calls
                    objs, pos = _JSON.raw_decode(text, pos)
                    if not isinstance(objs, list) or not objs:
                        return None
                else:  # name[ARGS]{arguments}
                    arguments, pos = _JSON.raw_decode(text, named.end())
                    objs = [{"name": named.group(1), "arguments": arguments}]
            except ValueError:
                return None
            for obj in objs:
                if (call := _call_of(self, obj)) is None:
                    return None
                calls.append(call)
            pos = _SPACE.match(text, pos).end()
        return calls

    def calls_pattern(self, call: str, several: bool) -> str:
        # The JSON list alone: [TOOL_CALLS] is a control token, which a structure's text never holds (vLLM
        # forces Mistral's calls the same way); `forced` reads it back.
        return r"\[" + call + (f"(, {call})*" if several else "") + r"\]"

    def forced(self) -> "Mistral":
        return _ForcedMistral()

    def new_call(self, name: str, arguments: dict) -> ToolCall:
        alphabet = string.ascii_letters + string.digits  # (Mistral's templates refuse any other id)
        return ToolCall(name, json.dumps(arguments, ensure_ascii=False),
                        id="".join(random.SystemRandom().choices(alphabet, k=9)))


class _ForcedMistral(Mistral):
    """A reply held to Mistral's forced pattern: its JSON list of calls without the [TOOL_CALLS] before it."""

    def split(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        if not final:  # (the calls come at the end, as Mistral's do)
            return "", []
        content, calls = super().split(MISTRAL_CALLS + text, final=True)
        return (content if calls else text), calls


class Harmony(ToolCallFormat):
    name = "openai"  # (vLLM's name of GPT-OSS's)
    keeps_special_tokens = True
    can_force = False

    def split(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        return _split_blocks(text, final, HARMONY_START, self._block)

    def _block(self, text: str, start: int, final: bool) -> tuple[int, ToolCall | None] | None:
        begin = text.find(HARMONY_MESSAGE, start)
        ends = [(i, m) for m in HARMONY_ENDS if begin >= 0 and (i := text.find(m, begin)) >= 0]
        if not ends and (not final or begin < 0):  # (a message still being written, or a header cut off)
            return None
        end, marker = min(ends) if ends else (len(text), "")  # (the reply's end: its <|call|> was an EOS)
        name = harmony_function(text[start:begin])
        if name is None:
            return end + len(marker), None
        try:
            arguments = json.loads(text[begin + len(HARMONY_MESSAGE):end])
        except ValueError:
            arguments = None
        return end + len(marker), _call_of(self, {"name": name, "arguments": arguments})

    def calls_pattern(self, call: str, several: bool) -> str:
        raise ValueError("GPT-OSS's calls cannot be forced (tool_choice \"required\" or a named function): a call's "
                         "header is special tokens, which a structured output's text never holds")


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (Hermes(), QwenXml(), Llama3Json(), Mistral(), Harmony())}
HERMES = FORMATS["hermes"]
_LLAMA3_SIGNS = ('{"name": function name, "parameters"', PYTHON_TAG)  # (in Llama 3.1-3.3's templates)


def tool_call_format(template: str | None) -> ToolCallFormat:
    """The format a chat template asks the model to write calls in, or a ValueError that says why none."""
    t = str(template or "")
    if HARMONY_CALL in t:
        return FORMATS["openai"]
    if MISTRAL_CALLS in t:
        return FORMATS["mistral"]
    if "<function=" in t and "<parameter=" in t:  # (Qwen3-Coder's)
        return FORMATS["qwen3_coder"]
    if "<function=" in t or "<arg_key>" in t:  # (GLM's, and other XML formats)
        raise ValueError("this model's chat template asks for calls in an XML format this server does not read "
                         "(<arg_key>, or <function=...> without <parameter=...>)")
    if OPEN in t:
        return HERMES
    if any(sign in t for sign in _LLAMA3_SIGNS):
        return FORMATS["llama3_json"]
    raise ValueError(f"this model's chat template asks for calls in none of the formats this server reads "
                     f"({', '.join(FORMATS)}); if the model writes one of them, name it with --tool-call-parser")


def _format(fmt: ToolCallFormat | str) -> ToolCallFormat:
    if isinstance(fmt, ToolCallFormat):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"tool call format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def parse_tool_calls(text: str, fmt: ToolCallFormat | str = HERMES) -> tuple[str | None, list[ToolCall]]:
    """A finished reply's content (None where nothing but calls was said) and its tool calls, in order."""
    content, calls = _format(fmt).split(text, final=True)
    content = content.strip()
    return content or None, calls


class ToolCallStream:
    """The same split as `parse_tool_calls`, as text arrives: `feed` returns the content that is certain
    now and the calls completed since the last feed; `finish` returns what was held back.

    Held back until it is certain: what may still be markup (a tail that may begin it, a Hermes block not
    closed yet, a whole Llama reply that starts as JSON, Mistral's calls), and whitespace that may turn out
    to end the content (the finished content is stripped).
    """

    def __init__(self, parallel: bool = True, fmt: ToolCallFormat | str = HERMES):
        self.parallel = parallel  # False: the first call only (OpenAI's parallel_tool_calls)
        self.format = _format(fmt)
        self.text, self.sent, self.calls = "", 0, 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.text += text
        content, calls = self.format.split(self.text, final=False)
        return self._new(content.lstrip().rstrip(), calls)

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = self.format.split(self.text, final=True)
        return self._new(content.strip(), calls)

    def _new(self, content: str, calls: list[ToolCall]) -> tuple[str, list[ToolCall]]:
        if not self.parallel:
            calls = calls[:1]
        delta, self.sent = content[self.sent:], max(self.sent, len(content))
        new, self.calls = calls[self.calls:], len(calls)
        return delta, new


def call_structure(tools: list[dict], name: str | None = None, several: bool = False,
                   fmt: ToolCallFormat | str = HERMES) -> StructuredOutputsParams:
    """The structure of a reply that is a call (OpenAI's tool_choice "required", or naming `name`) in the
    format `fmt`: one calling one of the tools with arguments to its parameters' schema; `several`: one or
    more calls; `fmt.forced()` reads the reply. A ValueError where a schema cannot be held to."""
    functions = [f for f in (t["function"] for t in tools) if name is None or f["name"] == name]
    return StructuredOutputsParams(regex=_format(fmt).forced_pattern(functions, several))


def _split_blocks(text: str, final: bool, opener: str, block) -> tuple[str, list[ToolCall]]:
    """A format's split where calls are blocks that begin with `opener`: `block(text, start, final)` gives
    where the block at `start` stops and its call (None: not one, its text stays content), or None while the
    block is still open (held back; at the reply's end, content as written)."""
    content, calls, pos = [], [], 0
    while True:
        start = text.find(opener, pos)
        if start < 0:
            tail = text[pos:]
            content.append(tail if final else tail[:len(tail) - _tag_prefix(tail, opener)])
            return "".join(content), calls
        content.append(text[pos:start])
        found = block(text, start, final)
        if found is None:
            if final:
                content.append(text[start:])
            return "".join(content), calls
        stop, call = found
        if call is None:
            content.append(text[start:stop])
        else:
            calls.append(call)
        pos = stop


def _call_of(fmt: ToolCallFormat, obj) -> ToolCall | None:
    """A call from its decoded JSON object, or None where it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))  # (models of every format write either)
    if not isinstance(arguments, dict):
        return None
    return fmt.new_call(obj["name"], arguments)


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


def _tag_prefix(tail: str, tag: str) -> int:
    """Length of the longest end of `tail` that begins `tag` (and may become it)."""
    for k in range(min(len(tail), len(tag) - 1), 0, -1):
        if tail.endswith(tag[:k]):
            return k
    return 0
