"""Reading tool calls out of a reply (`treeflash/tool_calls.py`): the whole text's split, and the streamed split
giving the same content and calls however the text arrives; then tool calls and the chat prompt's fields
through `treeflash serve` with a real model whose template takes tools (Qwen2.5-Coder-0.5B-Instruct)."""

from __future__ import annotations

import json
import random

import pytest

from treeflash.tool_calls import ToolCallStream, parse_tool_calls, template_writes_tool_calls

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


def _calls(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_parse_tool_calls(text, content, calls):
    got_content, got_calls = parse_tool_calls(text)
    assert got_content == content
    assert _calls(got_calls) == calls
    assert all(c.id.startswith("call_") for c in got_calls) and len({c.id for c in got_calls}) == len(got_calls)


def test_arguments_keep_non_ascii_text():
    _, [call] = parse_tool_calls(ROME)
    assert call.arguments == '{"city": "Rome", "unit": "°C"}'


def _streamed(text: str, cuts: list[int], parallel: bool = True) -> tuple[str, list, list[str]]:
    reader, content, calls, deltas = ToolCallStream(parallel), "", [], []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        delta, new = reader.feed(text[a:b])
        content, calls, deltas = content + delta, calls + new, deltas + [delta]
    delta, new = reader.finish()
    return content + delta, calls + new, deltas


@pytest.mark.parametrize("text, content, calls", CASES)
def test_stream_equals_whole_text_at_every_cut(text, content, calls):
    for cut in range(len(text) + 1):
        got, got_calls, _ = _streamed(text, [cut])
        assert (got or None, _calls(got_calls)) == (content, calls), cut
    rng = random.Random(len(text))
    for _ in range(20):  # one character at a time, and random pieces
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8)))) if len(text) > 1 else []
        for pieces in (cuts, list(range(1, len(text)))):
            got, got_calls, _ = _streamed(text, pieces)
            assert (got or None, _calls(got_calls)) == (content, calls), pieces


def test_stream_sends_no_markup_and_no_call_text():
    text = "Checking.\n" + PARIS + "\n" + ROME
    _, calls, deltas = _streamed(text, list(range(1, len(text))))
    assert "".join(deltas) == "Checking."
    assert not any("<" in d for d in deltas)
    assert len(calls) == 2


def test_stream_sends_a_call_as_soon_as_its_block_closes():
    reader = ToolCallStream()
    assert reader.feed("Hi " + PARIS[:-1]) == ("Hi", [])
    content, calls = reader.feed(PARIS[-1] + " and")
    assert content == "  and" and _calls(calls) == [("get_weather", {"city": "Paris"})]
    assert reader.feed(" more") == (" more", [])
    assert reader.finish() == ("", [])


def test_parallel_false_keeps_the_first_call():
    content, calls, _ = _streamed(PARIS + ROME, [5, 40, 90])
    assert len(calls) == 2
    content, calls, _ = _streamed(PARIS + ROME, [5, 40, 90], parallel=False)
    assert _calls(calls) == [("get_weather", {"city": "Paris"})] and content == ""


def test_template_writes_tool_calls():
    assert template_writes_tool_calls("{% if tools %}<tools>{{ tools }}</tools> answer in <tool_call></tool_call>")
    assert not template_writes_tool_calls("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not template_writes_tool_calls(None)


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


TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
JOKE = [{"role": "user", "content": "Tell me a joke."}]


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_forced_calls_follow_the_tools_schemas(qwen):
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})):
        reply = _ask(qwen, messages=JOKE, tools=[WEATHER, TIME], tool_choice=choice).choices[0]
        assert reply.finish_reason == "tool_calls" and reply.message.content is None
        assert reply.message.tool_calls and all(c.function.name in names for c in reply.message.tool_calls)
        for call in reply.message.tool_calls:
            arguments = json.loads(call.function.arguments)
            assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
        streamed = list(_ask(qwen, messages=JOKE, tools=[WEATHER, TIME], tool_choice=choice, stream=True))
        calls = [c for chunk in streamed if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
        assert [(c.function.name, c.function.arguments) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in reply.message.tool_calls]


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
