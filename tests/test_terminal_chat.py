"""`treeflash chat`: each reply is what offline chat gives the conversation so far, /reset starts a new one,
a conversation past the context is refused without ending the chat, and a stopped reply leaves the engine
ready for the next turn."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

import treeflash
from helpers import make_tiny_chat_target
from treeflash import LLM, SamplingParams
from treeflash.terminal_chat import Chat, read_message

CONTEXT = 256


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_chat_target(tmp_path_factory.mktemp("chat") / "chars", max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), device="cpu", max_num_seqs=1)


def reply(offline: LLM, messages: list[dict], max_tokens: int = 12, **kw) -> str:
    return offline.chat(messages, SamplingParams(temperature=0, max_tokens=max_tokens, **kw))[0].text


def test_the_command_answers_each_turn_as_offline_chat_does(model_dir, offline):
    lines = ["name a tree", "and a bird", "/reset", "/help", "x" * (CONTEXT + 5), "a long\\", "message", "/exit",
             "never read"]
    root = str(Path(treeflash.__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-m", "treeflash.cli", "chat", "--model", str(model_dir), "--device", "cpu",
                           "--spec", "none", "--temperature", "0", "--max-tokens", "12", "--system", "be brief"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    system = {"role": "system", "content": "be brief"}
    conversation = [system, {"role": "user", "content": "name a tree"}]
    first = reply(offline, conversation)
    conversation += [{"role": "assistant", "content": first}, {"role": "user", "content": "and a bird"}]
    second = reply(offline, conversation)
    third = reply(offline, [system, {"role": "user", "content": "a long\nmessage"}])  # (after /reset)
    assert done.stdout.split("\n")[:-1] == [first, second, third]
    assert "(a new conversation)" in done.stderr and "/reset  forget the conversation" in done.stderr
    assert f"the context {CONTEXT}: /reset starts a new one" in done.stderr
    assert done.stderr.count("[none] ") == 3  # a summary line a reply


def test_a_stopped_reply_stays_in_the_conversation_and_the_next_turn_is_exact(offline):
    class StopAfterFirst(io.StringIO):
        def write(self, text):
            chat._interrupt(None, None)  # (as Ctrl-C would, between rounds)
            return super().write(text)

    chat = Chat(offline, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), out=StopAfterFirst(),
                err=io.StringIO())
    assert chat.say("name a tree") is None
    partial = chat.messages[-1]["content"]
    whole = reply(offline, [{"role": "user", "content": "name a tree"}], 40, ignore_eos=True)
    assert partial and whole.startswith(partial) and len(partial) < len(whole)
    assert "(stopped)" in chat.err.getvalue()

    chat.out = io.StringIO()
    out = chat.say("and a bird")
    want = reply(offline, [{"role": "user", "content": "name a tree"}, {"role": "assistant", "content": partial},
                           {"role": "user", "content": "and a bird"}], 40, ignore_eos=True)
    assert out is not None and chat.messages[-1]["content"] == want and chat.out.getvalue() == want + "\n"


def test_a_message_goes_on_after_a_backslash(monkeypatch):
    lines = iter(["one\\", "two\\", "three", "four"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert read_message("", False) == "one\ntwo\nthree"
    assert read_message("", False) == "four"
    monkeypatch.setattr("builtins.input", lambda prompt="": (_ for _ in ()).throw(EOFError))
    assert read_message("", False) is None


def test_a_reasoning_parser_shows_the_reasoning_apart_and_keeps_it_beside_the_answer(offline, monkeypatch):
    """--reasoning-parser: a reply's reasoning is written first (dimmed on a terminal), the answer a line
    apart, and the conversation keeps the answer as the content with the reasoning beside it, under the
    names Qwen3's and GPT-OSS's templates read."""
    from treeflash.reasoning import ReasoningStream
    from treeflash.terminal_chat import _Shown

    out = io.StringIO()
    shown = _Shown(out, ReasoningStream())
    for piece in ("<think>pl", "an</thi", "nk>\n\nans", "wer"):
        shown.feed(piece)
    shown.finish()
    assert (out.getvalue(), shown.reasoning, shown.content) == ("plan\n\nanswer\n", "plan", "answer")

    monkeypatch.setattr("treeflash.reasoning.starts_in_reasoning", lambda text: True)  # (a prompt that opens it)
    chat = Chat(offline, SamplingParams(temperature=0, max_tokens=12), out=io.StringIO(), err=io.StringIO(),
                reasoning_parser="qwen3")
    assert chat.say("name a tree") is not None
    thought = reply(offline, [{"role": "user", "content": "name a tree"}]).strip()
    assert chat.messages[-1] == {"role": "assistant", "content": "", "reasoning_content": thought, "thinking": thought}
    assert chat.out.getvalue() == thought + "\n"
    assert not Chat(offline, SamplingParams(), reasoning_parser="openai_gptoss").params.skip_special_tokens
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        Chat(offline, SamplingParams(), reasoning_parser="think")
