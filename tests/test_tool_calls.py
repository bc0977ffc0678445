"""Reading tool calls out of a reply (`treeflash/tool_calls.py`), in each format: the whole text's split, and
the streamed split giving the same content and calls however the text arrives; which format a template asks
for; then tool calls and the chat prompt's fields through `treeflash serve` with a real model whose template
takes tools (Qwen2.5-Coder-0.5B-Instruct)."""

from __future__ import annotations

import json
import random
import re

import pytest

from treeflash.tool_calls import FORMATS, ToolCallStream, call_structure, parse_tool_calls, tool_call_format

PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ROME = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "°C"}}\n</tool_call>'

# (reply, expected content, expected calls as (name, arguments object))
CASES = [
    ("Hello there.", "Hello there.", []),
    ("", None, []),
    (PARIS, None, [("get_weather", {"city": "Paris"})]),
    (PARIS + "\n" + ROME, None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "unit": "°C"})]),
    ("Let me look.\n" + PARIS + "\n", "Let me look.", [("get_weather", {"city": "Paris"})]),
    ("  Before " + PARIS + " after.  ", "Before  after.", [("get_weather", {"city": "Paris"})]),
    ('<tool_call>{"name": "now"}</tool_call>', None, [("now", {})]),  # no arguments: an empty object
    ('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>', None, [("f", {"x": 1})]),
    # the closing tag inside an argument string (escaped quotes around it) does not end the block
    ('<tool_call>{"name": "emit", "arguments": {"code": "print(\\"</tool_call>\\")"}}</tool_call> done',
     "done", [("emit", {"code": 'print("</tool_call>")'})]),
    # not calls: kept in the content as written
    ('<tool_call>{"name": "f", "arguments": </tool_call>', '<tool_call>{"name": "f", "arguments": </tool_call>', []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ('<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>', '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>',
     []),
    ('<tool_call>["f"]</tool_call> ' + PARIS, '<tool_call>["f"]</tool_call>', [("get_weather", {"city": "Paris"})]),
    # cut inside a block (a length limit): the open block is text
    ('Sure. <tool_call>\n{"name": "get_weather", "argu', 'Sure. <tool_call>\n{"name": "get_weather", "argu', []),
    ("a < b, and <tool_ is not a tag", "a < b, and <tool_ is not a tag", []),
    ("ends with <tool_", "ends with <tool_", []),
    ("</tool_call> alone", "</tool_call> alone", []),
    ('<tool_call>{"name": "f</tool_call> a string never closed', '<tool_call>{"name": "f</tool_call> a string never closed',
     []),
]


LLAMA_PARIS = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA_ROME = '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "°C"}}'
LLAMA_CASES = [
    ("Hello there.", "Hello there.", []),
    ("", None, []),
    ("  \n", None, []),
    (LLAMA_PARIS, None, [("get_weather", {"city": "Paris"})]),
    ("\n <|python_tag|>" + LLAMA_PARIS + "\n", None, [("get_weather", {"city": "Paris"})]),
    ("<|python_tag|> " + LLAMA_PARIS + "; " + LLAMA_ROME + ";", None,
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "unit": "°C"})]),
    (LLAMA_PARIS + ";" + LLAMA_ROME, None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome",
                                                                                                  "unit": "°C"})]),
    ('{"name": "now", "arguments": {}}', None, [("now", {})]),  # (either key)
    ('{"name": "emit", "parameters": {"code": "x = {\\"a\\": 1}; y"}}', None, [("emit", {"code": 'x = {"a": 1}; y'})]),
    # not calls: the whole reply is content, as written
    ("Sure: " + LLAMA_PARIS, "Sure: " + LLAMA_PARIS, []),
    (LLAMA_PARIS + " and more", LLAMA_PARIS + " and more", []),
    (LLAMA_PARIS + "; hello", LLAMA_PARIS + "; hello", []),
    ('{"a": 1}', '{"a": 1}', []),
    ('{"name": "get_weather", "parameters": {"ci', '{"name": "get_weather", "parameters": {"ci', []),  # a length cut
    ('{"name": "f", "parameters": "x=1"}', '{"name": "f", "parameters": "x=1"}', []),
    ("<|python_tag|>print(1)", "<|python_tag|>print(1)", []),
    ("<|python", "<|python", []),
    ("<|python_tag|>", "<|python_tag|>", []),
]
MISTRAL_PARIS = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
MISTRAL_CASES = [
    ("Hello there.", "Hello there.", []),
    ("", None, []),
    (MISTRAL_PARIS, None, [("get_weather", {"city": "Paris"})]),
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": '
     '{"city": "Rome", "unit": "°C"}}]', None,
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "unit": "°C"})]),
    ("Let me look. " + MISTRAL_PARIS + "\n", "Let me look.", [("get_weather", {"city": "Paris"})]),
    # the newer form: one name[ARGS]{...} per [TOOL_CALLS]
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "unit": "°C"}',
     None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "unit": "°C"})]),
    ('[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}', None, [("now", {})]),
    # not calls: the whole reply is content, as written
    ("[TOOL_CALLS][]", "[TOOL_CALLS][]", []),
    ('[TOOL_CALLS][{"name": "f", "arguments": {"x": ', '[TOOL_CALLS][{"name": "f", "arguments": {"x":', []),
    (MISTRAL_PARIS + " and then text", MISTRAL_PARIS + " and then text", []),
    ("[TOOL_CALLS]get_weather{}", "[TOOL_CALLS]get_weather{}", []),
    ("a [TOOL_ that is not", "a [TOOL_ that is not", []),
    ("ends with [TOOL_", "ends with [TOOL_", []),
]
XML_PARIS = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
XML_ROME = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=unit>\n°C\n"
            "</parameter>\n</function>\n</tool_call>")
XML_CASES = [  # (read without a request's tools: every value text)
    ("Hello there.", "Hello there.", []),
    ("", None, []),
    (XML_PARIS, None, [("get_weather", {"city": "Paris"})]),
    ("Let me look.\n" + XML_PARIS + "\n" + XML_ROME, "Let me look.",
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "unit": "°C"})]),
    ("<tool_call>\n<function=now>\n</function>\n</tool_call>", None, [("now", {})]),
    # a value keeps its inner lines and spaces; one newline at each end is the markup's
    ("<tool_call>\n<function=write>\n<parameter=text>\n\n  two\nlines \n\n</parameter>\n</function>\n</tool_call>",
     None, [("write", {"text": "\n  two\nlines \n"})]),
    ("<tool_call><function=f><parameter=x>1</parameter></function></tool_call>", None, [("f", {"x": "1"})]),
    # a value may hold the block's closing tags (code that writes calls): the parameter ends the value
    ("<tool_call>\n<function=emit>\n<parameter=code>\nprint('</function></tool_call>')\n</parameter>\n</function>\n"
     "</tool_call> done", "done", [("emit", {"code": "print('</function></tool_call>')"})]),
    ("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\nstray</tool_call> after",
     "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\nstray</tool_call> after", []),
    # not calls: kept in the content as written
    ("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>",
     "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>", []),  # no </function>
    ("<tool_call>\n<function=f>\nstray<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=f>\nstray<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>", []),
    ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', '<tool_call>\n{"name": "f", "arguments": {}}\n'
     '</tool_call>', []),  # (Hermes' JSON is not this format)
    ("Sure. <tool_call>\n<function=get_weather>\n<parameter=ci", "Sure. <tool_call>\n<function=get_weather>\n"
     "<parameter=ci", []),  # a length cut
    ("ends with <tool_", "ends with <tool_", []),
]
ALL_CASES = [("hermes", *c) for c in CASES] + [("llama3_json", *c) for c in LLAMA_CASES] + \
    [("mistral", *c) for c in MISTRAL_CASES] + [("qwen3_coder", *c) for c in XML_CASES]


def _calls(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("fmt, text, content, calls", ALL_CASES)
def test_parse_tool_calls(fmt, text, content, calls):
    got_content, got_calls = parse_tool_calls(text, fmt)
    assert got_content == content
    assert _calls(got_calls) == calls
    assert len({c.id for c in got_calls}) == len(got_calls)
    if fmt == "mistral":  # (Mistral's templates refuse other ids in the next turn)
        assert all(len(c.id) == 9 and c.id.isalnum() and c.id.isascii() for c in got_calls)
    else:
        assert all(c.id.startswith("call_") for c in got_calls)


def test_arguments_keep_non_ascii_text():
    _, [call] = parse_tool_calls(ROME)
    assert call.arguments == '{"city": "Rome", "unit": "°C"}'


def _streamed(text: str, cuts: list[int], parallel: bool = True, fmt: str = "hermes") -> tuple[str, list, list[str]]:
    reader, content, calls, deltas = ToolCallStream(parallel, fmt), "", [], []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        delta, new = reader.feed(text[a:b])
        content, calls, deltas = content + delta, calls + new, deltas + [delta]
    delta, new = reader.finish()
    return content + delta, calls + new, deltas


@pytest.mark.parametrize("fmt, text, content, calls", ALL_CASES)
def test_stream_equals_whole_text_at_every_cut(fmt, text, content, calls):
    for cut in range(len(text) + 1):
        got, got_calls, _ = _streamed(text, [cut], fmt=fmt)
        assert (got or None, _calls(got_calls)) == (content, calls), cut
    rng = random.Random(len(text))
    for _ in range(20):  # one character at a time, and random pieces
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8)))) if len(text) > 1 else []
        for pieces in (cuts, list(range(1, len(text)))):
            got, got_calls, _ = _streamed(text, pieces, fmt=fmt)
            assert (got or None, _calls(got_calls)) == (content, calls), pieces


@pytest.mark.parametrize("fmt, text", [("hermes", "Checking.\n" + PARIS + "\n" + ROME),
                                       ("llama3_json", "<|python_tag|>" + LLAMA_PARIS + "; " + LLAMA_ROME),
                                       ("mistral", "Checking. " + MISTRAL_PARIS[:-1] + ', ' + MISTRAL_PARIS[13:])])
def test_stream_sends_no_markup_and_no_call_text(fmt, text):
    _, calls, deltas = _streamed(text, list(range(1, len(text))), fmt=fmt)
    assert "".join(deltas) == ("" if fmt == "llama3_json" else "Checking.")
    assert not any(c in d for d in deltas for c in "<[{")
    assert len(calls) == 2


def test_stream_sends_a_call_as_soon_as_its_block_closes():
    reader = ToolCallStream()
    assert reader.feed("Hi " + PARIS[:-1]) == ("Hi", [])
    content, calls = reader.feed(PARIS[-1] + " and")
    assert content == "  and" and _calls(calls) == [("get_weather", {"city": "Paris"})]
    assert reader.feed(" more") == (" more", [])
    assert reader.finish() == ("", [])


def test_stream_sends_text_that_cannot_be_a_llama_call_at_once():
    reader = ToolCallStream(fmt="llama3_json")
    assert reader.feed("  ") == ("", [])
    assert reader.feed("The weather") == ("The weather", [])
    reader = ToolCallStream(fmt="llama3_json")
    assert reader.feed(LLAMA_PARIS) == ("", [])  # (a call, or JSON text: known at the end)
    content, calls = reader.finish()
    assert content == "" and _calls(calls) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("fmt, text", [("hermes", PARIS + ROME), ("llama3_json", LLAMA_PARIS + ";" + LLAMA_ROME),
                                       ("mistral", MISTRAL_PARIS + MISTRAL_PARIS)])
def test_parallel_false_keeps_the_first_call(fmt, text):
    content, calls, _ = _streamed(text, [5, 40, 90], fmt=fmt)
    assert len(calls) == 2
    content, calls, _ = _streamed(text, [5, 40, 90], parallel=False, fmt=fmt)
    assert _calls(calls) == [("get_weather", {"city": "Paris"})] and content == ""


def test_tool_call_format_from_the_template():
    assert tool_call_format("{% if tools %}<tools>{{ tools }}</tools> in <tool_call></tool_call>").name == "hermes"
    assert tool_call_format("{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary' }}"
                            ).name == "llama3_json"
    assert tool_call_format("{{- '<|python_tag|>' + tool_call.name }}").name == "llama3_json"
    assert tool_call_format("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS] {{ '[TOOL_CALLS][' }}").name == "mistral"
    # (Qwen3-Coder's: <tool_call> and then XML)
    assert tool_call_format("<tool_call>\n<function={{ name }}>\n<parameter=x>").name == "qwen3_coder"
    with pytest.raises(ValueError, match="XML format"):  # (GLM's)
        tool_call_format("<tool_call>{{ name }}<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>")
    for template in ("{% for m in messages %}{{ m.content }}{% endfor %}", None, "{{ tools | tojson }}"):
        with pytest.raises(ValueError, match="--tool-call-parser"):
            tool_call_format(template)


def test_qwen3_coder_values_take_their_parameters_types():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"}, "tags": {"type": "array"},
        "opts": {"type": "object"}, "name": {"type": "string"}, "maybe": {"type": ["integer", "null"]},
        "any": {}}}}}]
    values = {"n": "42", "x": "2.5", "ok": "true", "tags": '["a", 1]', "opts": '{"k": null}', "name": "42",
              "maybe": "null", "any": "[1]", "extra": "7"}
    text = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items()) \
        + "</function>\n</tool_call>"
    fmt = FORMATS["qwen3_coder"].for_tools(tools)
    _, calls = parse_tool_calls(text, fmt)
    assert json.loads(calls[0].arguments) == {"n": 42, "x": 2.5, "ok": True, "tags": ["a", 1], "opts": {"k": None},
                                              "name": "42", "maybe": None, "any": "[1]", "extra": "7"}
    # a value that is not of its type stays text; another function's schema is not this one's
    wrong = text.replace("\n42\n", "\nforty-two\n", 1).replace("\ntrue\n", "\nyes\n")
    assert json.loads(parse_tool_calls(wrong, fmt)[1][0].arguments)["n"] == "forty-two"
    assert json.loads(parse_tool_calls(wrong, fmt)[1][0].arguments)["ok"] == "yes"
    assert json.loads(parse_tool_calls(text.replace("=f>", "=g>"), fmt)[1][0].arguments)["n"] == "42"
    assert FORMATS["hermes"].for_tools(tools) is FORMATS["hermes"]


def test_qwen3_coder_forced_calls_are_laid_out_as_the_template_writes_them():
    from outlines_core import Index, Vocabulary

    tools = TOOLS + [{"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "properties": {
        "days": {"type": "integer"}, "note": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["days"]}}}]
    fmt = FORMATS["qwen3_coder"].for_tools(tools)
    pattern = re.compile(call_structure(tools, several=True, fmt=fmt).regex)
    plan = ("<tool_call>\n<function=plan>\n<parameter=days>\n3\n</parameter>\n<parameter=note>\nsee </param and"
            " <b>\nthis</b>\n</parameter>\n</function>\n</tool_call>")
    replies = [XML_PARIS, XML_PARIS + "\n" + plan, "<tool_call>\n<function=now>\n</function>\n</tool_call>",
               XML_PARIS.replace("\nParis\n", "\nParis</function></tool_call>\n"),  # (read whole, as written)
               plan.replace("<parameter=note>", '<parameter=tags>\n["a","b"]\n</parameter>\n<parameter=note>')
               .replace("<parameter=note>\nsee </param and <b>\nthis</b>\n</parameter>\n", "")]
    for reply in replies:
        assert pattern.fullmatch(reply), reply
        content, calls = parse_tool_calls(reply, fmt)
        assert content is None and calls
    assert json.loads(parse_tool_calls(plan, fmt)[1][0].arguments) == {"days": 3, "note": "see </param and <b>\nthis</b>"}
    for reply in (XML_PARIS.replace("get_weather", "get_time"),  # no such function
                  "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",  # city is required
                  plan.replace("\n3\n", "\nthree\n"),  # days is an integer
                  plan.replace("see </param", "see </parameter>"),  # (the value would end there)
                  "Sure. " + XML_PARIS, PARIS):
        assert not pattern.fullmatch(reply), reply
    one = re.compile(call_structure(tools, "now", fmt=fmt).regex)
    assert one.fullmatch(replies[2]) and not one.fullmatch(XML_PARIS)
    # outlines-core builds the automaton of it (a vocabulary of single characters and the markup's words)
    words = {c: [i] for i, c in enumerate("abcdefghijklmnopqrstuvwxyz_=<>/\n 0123456789[]\",")}
    Index(call_structure(tools, "plan", fmt=fmt).regex, Vocabulary(99, words))


def test_a_forced_mistral_call_is_its_json_list_alone_and_read_back():
    """[TOOL_CALLS] is a control token no structure writes: a forced reply is the list after it, and the forced
    reader reads it as if the token came first (streamed, at the end, as Mistral's calls are)."""
    fmt = FORMATS["mistral"]
    reader = fmt.forced()
    pattern = re.compile(call_structure(TOOLS, several=True, fmt=fmt).regex)
    two = '[{"name":"now","arguments":{}}, {"name":"get_weather","arguments":{"city":"Rome"}}]'
    for reply in (MISTRAL_PARIS[len("[TOOL_CALLS]"):], two):
        assert pattern.fullmatch(reply), reply
        content, calls = parse_tool_calls(reply, reader)
        assert content is None and calls
        stream = ToolCallStream(fmt=reader)
        assert stream.feed(reply) == ("", [])
        assert [c.name for c in stream.finish()[1]] == [c.name for c in calls]
    assert [(c.name, json.loads(c.arguments)) for c in parse_tool_calls(two, reader)[1]] == [
        ("now", {}), ("get_weather", {"city": "Rome"})]
    for reply in (MISTRAL_PARIS, '[{"name":"get_weather","arguments":{}}]', '{"name":"now","arguments":{}}'):
        assert not pattern.fullmatch(reply), reply
    one = re.compile(call_structure(TOOLS, "now", fmt=fmt).regex)
    assert one.fullmatch('[{"name":"now","arguments":{}}]') and not one.fullmatch(two)
    assert parse_tool_calls("not a list", reader) == ("not a list", [])  # (kept as content, as any malformed call)
    assert fmt.forced().name == "mistral" and FORMATS["hermes"].forced() is FORMATS["hermes"]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "now"}}]


@pytest.mark.parametrize("fmt, replies, not_replies", [
    ("hermes", [PARIS, '<tool_call>\n{"name":"now","arguments":{}}\n</tool_call>\n' + PARIS.replace(" ", "")],
     [LLAMA_PARIS, "Sure. " + PARIS]),
    ("llama3_json", ['{"name":"get_weather","parameters":{"city":"Paris"}}',
                     '{"name":"now","parameters":{}}; {"name":"get_weather","parameters":{"city":"Rome"}}'],
     [PARIS, '{"name":"get_weather","arguments":{"city":"Paris"}}', '{"name":"get_weather","parameters":{}}'])])
def test_forced_calls_pattern_matches_what_the_format_reads(fmt, replies, not_replies):
    pattern = re.compile(call_structure(TOOLS, several=True, fmt=fmt).regex)
    for reply in replies:
        assert pattern.fullmatch(reply), reply
        content, calls = parse_tool_calls(reply, fmt)
        assert content is None and calls
    for reply in not_replies:
        assert not pattern.fullmatch(reply), reply
    one = re.compile(call_structure(TOOLS, "now", fmt=fmt).regex)
    assert not one.fullmatch(replies[1]) and not one.fullmatch(replies[0])
    assert set(FORMATS) == {"hermes", "qwen3_coder", "llama3_json", "mistral", "openai"}


# --- GPT-OSS's harmony calls (`openai`), read beside the harmony reasoning parser -------------------------
H_CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
          '<|message|>{"city": "Paris"}')
H_CUT = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Par'
HARMONY_CALL_CASES = [  # (reply, special tokens kept, as generated: <|call|> is an EOS id, so not in the text;
    #                      expected reasoning, content, calls)
    ('<|channel|>analysis<|message|>Weather first.<|end|><|start|>assistant<|channel|>commentary<|message|>'
     'Checking.<|end|>' + H_CALL, "Weather first.", "Checking.", [("get_weather", {"city": "Paris"})]),
    ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}', None, None,
     [("get_weather", {"city": "Paris"})]),  # the first message: its <|start|>assistant is the prompt's
    (' to=functions.now<|channel|>commentary json<|message|>{}', None, None, [("now", {})]),  # recipient first
    (H_CALL + '<|call|>' + H_CALL.replace("Paris", "Rome"), None, None,  # (<|call|> kept: ignore_eos)
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    ('<|channel|>analysis<|message|>Hm.<|end|>' + H_CUT, "Hm.", H_CUT, []),  # cut by a length limit: as written
    ('<|channel|>commentary to=functions.f<|message|>[1, 2]', None,  # arguments not an object: as written
     '<|start|>assistant<|channel|>commentary to=functions.f<|message|>[1, 2]', []),
    ('<|channel|>analysis to=browser.search<|message|>{"query": "x"}<|end|><|start|>assistant<|channel|>final'
     '<|message|>Done.<|return|>', '{"query": "x"}', "Done.", []),  # a built-in tool's message: a body
    ('<|channel|>final<|message|>No call.<|return|>', None, "No call.", []),
]


def _harmony_reader(parallel: bool = True):
    from treeflash.reasoning import HarmonyStream
    from treeflash.server.replies import ReplyReader

    return ReplyReader(HarmonyStream(calls=True), ToolCallStream(parallel, "openai"))


def _read(text: str, cuts: list[int], parallel: bool = True) -> tuple[str | None, str | None, list]:
    reader, got = _harmony_reader(parallel), ["", "", []]
    for part in [reader.feed(text[a:b]) for a, b in zip([0] + cuts, cuts + [len(text)])] + [reader.finish()]:
        got = [got[0] + part[0], got[1] + part[1], got[2] + part[2]]
    return got[0] or None, got[1] or None, _calls(got[2])


@pytest.mark.parametrize("text, reasoning, content, calls", HARMONY_CALL_CASES)
def test_harmony_calls_read_whole_and_streamed_at_every_cut(text, reasoning, content, calls):
    for cuts in [[cut] for cut in range(len(text) + 1)] + [list(range(1, len(text)))]:
        assert _read(text, cuts) == (reasoning, content, calls), cuts


def test_harmony_calls_parallel_false_keeps_the_first_and_forcing_is_refused():
    assert _read(HARMONY_CALL_CASES[3][0], [30, 90], parallel=False)[2] == [("get_weather", {"city": "Paris"})]
    with pytest.raises(ValueError, match="cannot be forced"):
        call_structure(TOOLS, fmt="openai")
    assert tool_call_format("{%- if tool_call %}{{ '<|message|>' + args + '<|call|>' }}{%- endif %}").name == "openai"


# --- through `treeflash serve` and the openai client, with a real model that calls tools -------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TWO_CITIES = [{"role": "user", "content": "What's the weather in Paris and in Rome?"}]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """Qwen2.5-Coder-0.5B-Instruct served (its template asks for <tool_call> blocks), and an openai client."""
    from helpers import qwen_coder_gguf
    from server_helpers import Server

    openai = pytest.importorskip("openai")
    srv = Server(str(qwen_coder_gguf()), "--spec", "none", "--max-model-len", "2048", "--max-num-seqs", "2",
                 "--served-model-name", "qwen", log_dir=tmp_path_factory.mktemp("qwen-server"))
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    srv.stop()


def _ask(client, messages=TWO_CITIES, **kw):
    return client.chat.completions.create(model="qwen", messages=messages, temperature=0,
                                          **{"max_tokens": 96, "tools": [WEATHER], **kw})


def _prompt_text(response) -> str:
    """The prompt as the model saw it (vLLM's prompt_logprobs name each prompt token)."""
    entries = response.model_extra["prompt_logprobs"][1:]
    return "".join(next(iter(e.values()))["decoded_token"] for e in entries)


CALLS = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_calls_tools_and_the_stream_says_the_same(qwen):
    reply = _ask(qwen)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == CALLS
    assert all(c.type == "function" and c.id.startswith("call_") for c in choice.message.tool_calls)

    chunks = list(_ask(qwen, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""  # no markup leaks into the content
    streamed = [call for d in deltas for call in d.tool_calls or []]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in streamed] == \
        [(i, name, args) for i, (name, args) in enumerate(CALLS)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_reads_the_calls_results(qwen):
    first = _ask(qwen).choices[0].message
    results = [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature_c": t})}
               for c, t in zip(first.tool_calls, (18, 24))]
    messages = TWO_CITIES + [first.model_dump(exclude_none=True)] + results
    reply = _ask(qwen, messages=messages, extra_body={"prompt_logprobs": 0})
    prompt = _prompt_text(reply)
    # The template got the calls (their arguments as objects, not re-quoted strings) and the results.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert prompt.count("<tool_response>") == 2 and '{"temperature_c": 24}' in prompt
    assert reply.choices[0].finish_reason in ("stop", "tool_calls", "length")


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_tool_choice_none_parallel_false_and_a_cut_call(qwen):
    none = _ask(qwen, tool_choice="none", max_tokens=8, extra_body={"prompt_logprobs": 0})
    assert "<tools>" not in _prompt_text(none) and not none.choices[0].message.tool_calls
    assert "<tools>" in _prompt_text(_ask(qwen, max_tokens=1, extra_body={"prompt_logprobs": 0}))

    one = _ask(qwen, parallel_tool_calls=False).choices[0]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in one.message.tool_calls] == CALLS[:1]
    assert one.finish_reason == "tool_calls" and one.message.content is None

    cut = _ask(qwen, max_tokens=10).choices[0]  # the reply stops inside its first block: text, not a call
    assert cut.finish_reason == "length" and not cut.message.tool_calls
    assert cut.message.content.startswith("<tool_call>")
    streamed = list(_ask(qwen, max_tokens=10, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == cut.message.content


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_continues_its_final_message(qwen):
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."},
                {"role": "assistant", "content": "```python\ndef add("}]
    reply = qwen.chat.completions.create(model="qwen", messages=messages, temperature=0, max_tokens=12, extra_body={
        "add_generation_prompt": False, "continue_final_message": True, "prompt_logprobs": 0})
    assert _prompt_text(reply).endswith("<|im_start|>assistant\n```python\ndef add(")  # no end of turn after it
    assert reply.choices[0].message.content.startswith(" a, b")  # the parameters, not a new answer


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_calls_tools_through_the_responses_api(qwen):
    """The chat endpoint's calls as function_call items, streamed or not; their results sent back as
    function_call_output items after previous_response_id make the prompt and reply the chat endpoint makes."""
    tool = {"type": "function", **WEATHER["function"]}  # (the Responses API's flat function tool)
    ask = dict(model="qwen", input=TWO_CITIES[0]["content"], tools=[tool], temperature=0, max_output_tokens=96)
    got = qwen.responses.create(**ask)
    assert [(i.type, i.name, json.loads(i.arguments)) for i in got.output] == [("function_call", *c) for c in CALLS]
    assert got.status == "completed" and got.output_text == "" and all(i.call_id.startswith("call_") for i in got.output)
    events = list(qwen.responses.create(**ask, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.name, i.arguments) for i in done] == [(i.type, i.name, i.arguments) for i in got.output]
    assert not [e for e in events if e.type.startswith("response.output_text")]  # no markup, no empty message

    results = [{"type": "function_call_output", "call_id": i.call_id, "output": json.dumps({"temperature_c": t})}
               for i, t in zip(got.output, (18, 24))]
    after = qwen.responses.create(model="qwen", input=results, previous_response_id=got.id, tools=[tool],
                                  temperature=0, max_output_tokens=48)
    calls = [{"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.arguments}}
             for i in got.output]
    messages = TWO_CITIES + [{"role": "assistant", "content": None, "tool_calls": calls}] + [
        {"role": "tool", "tool_call_id": r["call_id"], "content": r["output"]} for r in results]
    chat = _ask(qwen, messages=messages, max_tokens=48)
    assert after.usage.input_tokens == chat.usage.prompt_tokens
    assert after.output_text == (chat.choices[0].message.content or "")


TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
JOKE = [{"role": "user", "content": "Tell me a joke."}]


FORCED = [("required", {"get_weather", "get_time"}),
          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})]


def _forced_calls(client, messages, choice, names, **kw):
    """A reply held to calls (tool_choice `choice`) of the tools `names` with a `city` string each, streamed
    the same, no content either way; returns the non-streamed response."""
    raw = _ask(client, messages=messages, tools=[WEATHER, TIME], tool_choice=choice, **kw)
    reply = raw.choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    assert reply.message.tool_calls and all(c.function.name in names for c in reply.message.tool_calls)
    for call in reply.message.tool_calls:
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    streamed = list(_ask(client, messages=messages, tools=[WEATHER, TIME], tool_choice=choice, stream=True))
    deltas = [chunk.choices[0].delta for chunk in streamed if chunk.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    assert [(c.function.name, c.function.arguments) for d in deltas for c in d.tool_calls or []] == \
        [(c.function.name, c.function.arguments) for c in reply.message.tool_calls]
    return raw


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_forced_calls_follow_the_tools_schemas(qwen):
    for choice, names in FORCED:
        _forced_calls(qwen, JOKE, choice, names)


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_reply_follows_a_json_schema(qwen):
    schema = {"type": "object", "required": ["name", "age", "city"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}
    reply = qwen.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "Invent a person: name, age and city."}], temperature=0,
        max_tokens=80, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    person = json.loads(reply.choices[0].message.content)
    assert reply.choices[0].finish_reason == "stop"
    assert set(person) == {"name", "age", "city"} and isinstance(person["age"], int)
    pretty = qwen.chat.completions.create(  # vLLM's guided_whitespace_pattern: new lines allowed between tokens
        model="qwen", messages=[{"role": "user", "content": "Invent a person: name, age and city."}], temperature=0,
        max_tokens=80, extra_body={"guided_json": schema, "guided_whitespace_pattern": r"[\n ]{0,4}"})
    assert set(json.loads(pretty.choices[0].message.content)) == {"name", "age", "city"}


# --- another format through --chat-template: Llama 3's JSON calls, with the same real model ---------------
# A template of our own in the manner of Llama 3.1's: the tools and the format in a system turn, a call in
# the history as its JSON, a result as an "ipython" turn. (ChatML's markers, which this model knows.)
LLAMA_STYLE = """{%- for message in messages %}
{%- if loop.first and tools %}<|im_start|>system
Given the following functions, answer with a JSON function call. Respond in the format {"name": function name, \
"parameters": dictionary of argument name and its value}.
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- if message.tool_calls %}<|im_start|>assistant
{% for c in message.tool_calls %}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}\
{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>ipython
{{ message.content }}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def qwen_llama_style(tmp_path_factory):
    from helpers import qwen_coder_gguf
    from server_helpers import Server

    openai = pytest.importorskip("openai")
    folder = tmp_path_factory.mktemp("qwen-llama-style")
    (folder / "llama_style.jinja").write_text(LLAMA_STYLE)
    srv = Server(str(qwen_coder_gguf()), "--spec", "none", "--max-model-len", "2048", "--max-num-seqs", "2",
                 "--served-model-name", "qwen", "--chat-template", str(folder / "llama_style.jinja"),
                 "--enable-auto-tool-choice", log_dir=folder)
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    srv.stop()


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_forced_calls_in_llama_format_through_a_chat_template_file(qwen_llama_style):
    """--chat-template replaces the model's template, whose call format (llama3_json, found in it) the
    forced calls follow and the replies are read in; the calls go back to the template in the next turn."""
    client = qwen_llama_style
    for choice, names in FORCED:
        raw = _forced_calls(client, TWO_CITIES, choice, names, extra_body={"prompt_logprobs": 0})
        assert "Respond in the format" in _prompt_text(raw) and "<tools>" not in _prompt_text(raw)
        reply = raw.choices[0]
    call = reply.message.tool_calls[0]
    results = [{"role": "tool", "tool_call_id": call.id, "content": '{"time": "14:05"}'}]
    after = _ask(client, messages=TWO_CITIES + [reply.message.model_dump(exclude_none=True)] + results,
                 tools=[WEATHER, TIME], extra_body={"prompt_logprobs": 0})
    prompt = _prompt_text(after)
    assert f'{{"name": "get_time", "parameters": {call.function.arguments}}}' in prompt
    assert '<|im_start|>ipython\n{"time": "14:05"}' in prompt
