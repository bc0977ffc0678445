"""Reading a thinking model's reasoning out of its reply (`treeflash/reasoning.py`): the whole text's split, the
streamed split giving the same however the text arrives, and the structure that holds an answer after the block."""

from __future__ import annotations

import random
import re

import pytest

from treeflash.reasoning import CLOSE, ReasoningStream, _through_first, reasoning_structure, split_reasoning, \
    starts_in_reasoning
from treeflash.structured import StructuredOutputsParams

# (reply, the prompt opened the block, expected reasoning, expected content)
CASES = [
    ("<think>\nTwo and two.\n</think>\n\nFour.", False, "Two and two.", "Four."),
    ("  <think>x</think>y", False, "x", "y"),
    ("No block here.", False, None, "No block here."),
    ("  plain, leading spaces kept", False, None, "  plain, leading spaces kept"),
    ("Answer first <think>then a block</think> rest", False, None, "Answer first <think>then a block</think> rest"),
    ("<think>\n\n</think>\n\nEmpty thoughts.", False, None, "Empty thoughts."),
    ("<think>cut in the middle of a thou", False, "cut in the middle of a thou", None),
    ("<think>a </thin k and </think", False, "a </thin k and </think", None),  # (no whole tag: still inside)
    ("<thi", False, None, "<thi"),
    ("", False, None, None),
    ("Opened by the prompt.\n</think>\n\nDone.", True, "Opened by the prompt.", "Done."),
    ("never closed", True, "never closed", None),
    ("a</think>b</think>c", True, "a", "b</think>c"),  # the first tag ends the block
    ("<think>x</think><tool_call>{}</tool_call>", False, "x", "<tool_call>{}</tool_call>"),
]


@pytest.mark.parametrize("text, inside, reasoning, content", CASES)
def test_split_reasoning(text, inside, reasoning, content):
    assert split_reasoning(text, inside) == (reasoning, content)


def _streamed(text: str, cuts: list[int], inside: bool) -> tuple[str, str]:
    stream, reasoning, content = ReasoningStream(inside), "", ""
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        r, c = stream.feed(text[a:b])
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("text, inside, reasoning, content", CASES)
def test_stream_equals_whole_text_at_every_cut(text, inside, reasoning, content):
    expect = (reasoning or "", content or "")
    for cut in range(len(text) + 1):
        assert _streamed(text, [cut], inside) == expect, cut
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8)))) if len(text) > 1 else []
        assert _streamed(text, cuts, inside) == expect
    assert _streamed(text, list(range(1, len(text))), inside) == expect  # a character at a time


def test_the_stream_sends_reasoning_before_the_block_closes():
    stream = ReasoningStream()
    assert stream.feed("<think>\nFirst") == ("First", "")
    assert stream.feed(" step </th") == (" step", "")  # (the tag's start and the trailing space held back)
    assert stream.feed("ink>\n\nAnswer") == ("", "Answer")


def test_a_reply_starts_inside_where_the_prompt_opened_the_block():
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen3, thinking off
    assert not starts_in_reasoning("<|im_start|>assistant\n")


def test_the_block_pattern_ends_at_the_first_closing_tag():
    through = _through_first(CLOSE)
    rng = random.Random(0)
    for n in range(14):
        for _ in range(2000):
            s = "".join(rng.choice("</thinka>\n") for _ in range(n))
            if rng.random() < 0.3:
                k = rng.randrange(n + 1)
                s = s[:k] + CLOSE[:rng.randint(1, len(CLOSE))] + s[k:]
            assert (re.fullmatch(through, s) is not None) == (CLOSE in s and s.find(CLOSE) == len(s) - len(CLOSE)), s


@pytest.mark.parametrize("inside", [False, True])
def test_a_structure_holds_the_answer_after_the_block(inside):
    pattern = reasoning_structure(StructuredOutputsParams(choice=["yes", "no"]), inside).regex
    opened = "" if inside else "<think>"
    for text, ok in [(opened + "\nWeigh it: </thin k.\n</think>\n\nyes", True),
                     (opened + "a</think>no", True),
                     (opened + "a</think>maybe", False),
                     (opened + "a</think>yes</think>", False),
                     (opened + "yes", False)]:  # (the block must close before the answer)
        assert (re.fullmatch(pattern, text) is not None) == ok, text
    assert (re.fullmatch(pattern, "yes") is not None) == (not inside)  # no block: only where none was opened


def test_a_call_written_in_the_reasoning_is_thought_not_called():
    from treeflash.server.replies import ReplyReader
    from treeflash.tool_calls import ToolCallStream

    call = '<tool_call>{"name": "f", "arguments": {"x": %d}}</tool_call>'
    text = "<think>Maybe " + call % 1 + "?</think>\n\nSure. " + call % 2
    for cut in range(len(text) + 1):
        reader = ReplyReader(ReasoningStream(), ToolCallStream())
        parts = [reader.feed(text[:cut]), reader.feed(text[cut:]), reader.finish()]
        assert "".join(p[0] for p in parts) == "Maybe " + call % 1 + "?"
        assert "".join(p[1] for p in parts) == "Sure."
        assert [c.arguments for p in parts for c in p[2]] == ['{"x": 2}'] and reader.calls == 1


def test_an_unknown_parser_is_refused():
    from treeflash.server.frontend import Frontend, ServerConfig

    with pytest.raises(ValueError, match="qwen3, deepseek_r1"):
        Frontend(None, ServerConfig(model_name="m", reasoning_parser="r1"))


# --- through `treeflash serve --reasoning-parser qwen3` and the openai client, with a real model ---------------
@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from helpers import qwen_coder_gguf
    from server_helpers import Server

    openai = pytest.importorskip("openai")
    srv = Server(str(qwen_coder_gguf()), "--spec", "none", "--max-model-len", "2048", "--max-num-seqs", "2",
                 "--served-model-name", "qwen", "--reasoning-parser", "qwen3",
                 log_dir=tmp_path_factory.mktemp("qwen-reasoning-server"))
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300), srv.url
    srv.stop()


THINKING = [{"role": "user", "content": "Is 91 a prime number?"},
            {"role": "assistant", "content": "<think>\nLet me check whether 91 has a divisor."}]


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_reply_is_split_as_its_raw_text_is(qwen):
    import httpx

    client, url = qwen
    ask = dict(model="qwen", messages=THINKING, temperature=0, max_tokens=40,
               extra_body={"continue_final_message": True, "add_generation_prompt": False})
    reply = client.chat.completions.create(**ask).choices[0]
    # the same tokens through /v1/completions, which no parser reads: the raw text
    ids = httpx.post(url + "/tokenize", json={"model": "qwen", "messages": THINKING, "continue_final_message": True,
                                              "add_generation_prompt": False}).json()["tokens"]
    raw = client.completions.create(model="qwen", prompt=ids, temperature=0, max_tokens=40).choices[0].text
    assert (reply.message.model_extra["reasoning"], reply.message.content) == split_reasoning(raw, inside=True)
    assert reply.message.model_extra["reasoning_content"] == reply.message.model_extra["reasoning"]
    assert reply.message.model_extra["reasoning"]  # (the prompt opened the block: the reply starts in it)
    chunks = [c.choices[0].delta for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    streamed = ("".join(d.model_extra.get("reasoning") or "" for d in chunks),
                "".join(d.content or "" for d in chunks))
    assert streamed == (reply.message.model_extra["reasoning"], reply.message.content or "")


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_answers_a_schema_after_an_optional_block(qwen):
    import json

    client, _ = qwen
    schema = {"type": "object", "required": ["prime"], "properties": {"prime": {"type": "boolean"}}}
    reply = client.chat.completions.create(
        model="qwen", messages=THINKING[:1], temperature=0, max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}).choices[0]
    assert reply.finish_reason == "stop", (reply.message.content, reply.message.model_extra)
    assert set(json.loads(reply.message.content)) == {"prime"}
    assert reply.message.model_extra["reasoning"] is None  # (this model answers at once)


@pytest.mark.integration
@pytest.mark.slow
def test_real_model_reasoning_comes_as_a_reasoning_item_of_a_response(qwen):
    client, _ = qwen
    prompt = dict(temperature=0, extra_body={"continue_final_message": True, "add_generation_prompt": False})
    chat = client.chat.completions.create(model="qwen", messages=THINKING, max_tokens=40, **prompt).choices[0].message
    got = client.responses.create(model="qwen", input=THINKING, max_output_tokens=40, **prompt)
    assert [i.content[0].text for i in got.output if i.type == "reasoning"] == [chat.model_extra["reasoning"]]
    assert got.output[0].type == "reasoning" and got.output_text == (chat.content or "")
    events = list(client.responses.create(model="qwen", input=THINKING, max_output_tokens=40, stream=True, **prompt))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == chat.model_extra["reasoning"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == got.output_text
    assert [i.type for i in events[-1].response.output] == [i.type for i in got.output]


# --- GPT-OSS's harmony channels (`--reasoning-parser openai_gptoss`) ------------------------------------------
HARMONY_CASES = [  # (reply with special tokens kept, expected reasoning, expected content)
    ("<|channel|>analysis<|message|>Two and two.<|end|><|start|>assistant<|channel|>final<|message|>Four.<|return|>",
     "Two and two.", "Four."),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
     "<|start|>assistant<|channel|>final<|message|>c", "a\nb", "c"),  # two analyses; cut before the end marker
    ("<|channel|>final<|message|>Just the answer.", None, "Just the answer."),
    ("<|channel|>analysis<|message|>cut in the middle of a thou", "cut in the middle of a thou", None),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin", "x", None),  # a header cut off
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"x\": 1}<|call|>", None, '{"x": 1}'),
    ("<|channel|>analysis<|message|>a < b and c <| d<|end|>", "a < b and c <| d", None),
    ("No harmony here.", None, "No harmony here."),
    (" to=functions.f<|channel|>commentary json<|message|>{}", None, "{}"),  # a first header, recipient first
    ("to be or not", None, "to be or not"),  # (held while it may be such a header, then streamed)
    ("a <|weird|> reply", None, "a <|weird|> reply"),  # no message at all: its text, at its end
    ("", None, None),
]


@pytest.mark.parametrize("text, reasoning, content", HARMONY_CASES)
def test_harmony_channels_split_whole_and_streamed_at_every_cut(text, reasoning, content):
    from treeflash.reasoning import HarmonyStream, split_harmony

    assert split_harmony(text) == (reasoning, content)
    expect = (reasoning or "", content or "")
    for cuts in [[cut] for cut in range(len(text) + 1)] + [list(range(1, len(text)))]:
        stream, got = HarmonyStream(), ["", ""]
        for a, b in zip([0] + cuts, cuts + [len(text)]):
            for i, part in enumerate(stream.feed(text[a:b])):
                got[i] += part
        for i, part in enumerate(stream.finish()):
            got[i] += part
        assert tuple(got) == expect, cuts


def test_harmony_streams_reasoning_before_its_message_ends():
    from treeflash.reasoning import HarmonyStream

    stream = HarmonyStream()
    assert stream.feed("<|channel|>analysis<|mess") == ("", "")
    assert stream.feed("age|>First step <|e") == ("First step ", "")  # (a marker's start held back)
    assert stream.feed("nd|><|start|>assistant<|channel|>final<|message|>Do") == ("", "Do")


def test_a_harmony_model_served_without_its_parser_is_warned_about():
    """treeflash serve and chat warn where the chat template writes harmony (GPT-OSS's names its analysis
    channel) and --reasoning-parser openai_gptoss is not given: its replies would run both channels together."""
    from treeflash.reasoning import harmony_unread

    template = "{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' }}"
    assert "--reasoning-parser openai_gptoss" in harmony_unread(template, None)
    assert harmony_unread(template, "qwen3") is not None
    assert harmony_unread(template, "openai_gptoss") is None
    assert harmony_unread("{{ messages }}<think>", None) is None and harmony_unread(None, None) is None
