"""A thinking model's reasoning, read out of its reply (vLLM's `--reasoning-parser qwen3 | deepseek_r1 |
openai_gptoss`).

Qwen3, QwQ and DeepSeek-R1 think in a block, `<think> ... </think>`, then answer. Reading changes nothing
that is generated: the reply's text is split afterwards into the reasoning (the block's inside, stripped;
None where there is none) and the content (what follows the block, its leading whitespace dropped; the
whole text where the reply opens no block). A reply starts inside the block where the prompt opened it
(DeepSeek-R1's template ends in `<think>\\n`, as Qwen3.5's does); otherwise only a block at the reply's
very start counts (after whitespace). A reply cut inside its block is all reasoning.

The streamed split (`ReasoningStream`) gives the same reasoning and content as the whole text's
(`split_reasoning`) however the text arrives: what might still become a tag, or whitespace that might end
the reasoning, is held back until it is certain.

With a structured output (`reasoning_structure`), the structure holds the answer, after the block: the
reply's pattern becomes (a block) + (up to 4 blanks) + (the structure's pattern), the block's inside being
any text that does not close it.

GPT-OSS writes "harmony" instead (`openai_gptoss`): a reply is messages, each a header naming its channel and a
body, `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`, its markers
special tokens, so the reply is read with them kept (`HarmonyStream`). The analysis channel's bodies are the
reasoning; every other channel's (final, and commentary: preambles) the content; a header is neither. A
reply with no message at all is content (its text streamed as it comes where it has no marker, else at its
end), as is plain text after a message's end. Where a request's tool calls are read (`calls`), a message
addressed to a function (`to=functions.NAME` in its header) goes to the content whole, header and markers
included, once it has ended (or the reply has), for the `openai` tool-call format to read
(treeflash/tool_calls.py); a message to one of GPT-OSS's built-in tools (browser, python) stays a body.
"""

from __future__ import annotations

import re

from treeflash.structured import StructuredOutputsParams

OPEN, CLOSE = "<think>", "</think>"
HARMONY = "openai_gptoss"  # vLLM's name of GPT-OSS's
PARSERS = ("qwen3", "deepseek_r1", HARMONY)  # vLLM's names; the first two models write the same block
MESSAGE, MESSAGE_ENDS, CHANNEL = "<|message|>", ("<|end|>", "<|return|>", "<|call|>"), "<|channel|>"
START = "<|start|>assistant"  # (a reply's first header follows the prompt's, so it is written without it)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
# What may still become a first header written recipient first (` to=functions.f<|channel|>...`): held back.
_FIRST_RECIPIENT = re.compile(r"\s*(?:t|to|to=[^\s<]*)?\s*")
# Around the block a structure allows a little whitespace, not any amount: a model unsure of the answer
# would otherwise fill its tokens with blanks (U+205F, say), as a small model did in the tests.
SPACE = r"[ \t\r\n]{0,4}"


def starts_in_reasoning(prompt_text: str) -> bool:
    """Whether a reply to this prompt starts inside the block: the prompt's last `<think>` is open."""
    return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)


def split_reasoning(text: str, inside: bool = False) -> tuple[str | None, str | None]:
    """A finished reply's reasoning and content (None where empty); `inside`: the prompt opened the block."""
    reasoning, content = _split(text, inside, final=True)
    return reasoning or None, content or None


class ReasoningStream:
    """The same split as `split_reasoning`, as text arrives: `feed` returns the reasoning and content
    certain now (deltas), `finish` what was held back."""

    def __init__(self, inside: bool = False):
        self.inside, self.text, self.sent = inside, "", [0, 0]

    def feed(self, text: str) -> tuple[str, str]:
        self.text += text
        return self._new(*_split(self.text, self.inside, final=False))

    def finish(self) -> tuple[str, str]:
        return self._new(*_split(self.text, self.inside, final=True))

    def _new(self, reasoning: str, content: str) -> tuple[str, str]:
        out = reasoning[self.sent[0]:], content[self.sent[1]:]
        self.sent = [max(self.sent[0], len(reasoning)), max(self.sent[1], len(content))]
        return out


def _split(text: str, inside: bool, final: bool) -> tuple[str, str]:
    """(reasoning, content), each whole where `final`, else the part of it certain already."""
    if not inside:
        stripped = text.lstrip()
        if not stripped.startswith(OPEN):
            undecided = not final and OPEN.startswith(stripped)  # (whitespace, or "<thi" so far)
            return "", "" if undecided else text
        text = stripped[len(OPEN):]
    end = text.find(CLOSE)
    if end >= 0:
        return text[:end].strip(), text[end + len(CLOSE):].lstrip()
    if final:
        return text.strip(), ""
    hold = next((k for k in range(min(len(text), len(CLOSE) - 1), 0, -1) if text.endswith(CLOSE[:k])), 0)
    return text[:len(text) - hold].strip(), ""


def _through_first(word: str) -> str:
    """A regular expression (Rust syntax) for a text that ends at the first `word` in it. Built on word's
    first character occurring nowhere else in it (so a mismatch falls back either to nothing of word
    matched or, on that character, to one matched)."""
    first, rest = word[0], word[1:]
    assert first not in rest and len(set(rest)) == len(rest), word
    e = re.escape
    again = "|".join(e(rest[:j]) + e(first) for j in range(len(rest)))  # back to "first matched"
    leave = "|".join(e(rest[:j]) + f"[^{e(first)}{e(rest[j])}]" for j in range(len(rest)))  # back to none
    step = f"(?:[^{e(first)}]|{e(first)}(?:{again})*(?:{leave}))"  # from "none matched" back to it
    return f"{step}*{e(first)}(?:{again})*{e(rest)}"


def reasoning_structure(structure: StructuredOutputsParams, inside: bool) -> StructuredOutputsParams:
    """The structure of a whole reply whose answer, after its reasoning block, must follow `structure`:
    the block is required where the prompt opened it, else optional (at the reply's start)."""
    block = _through_first(CLOSE) if inside else f"(?:{SPACE}{re.escape(OPEN)}{_through_first(CLOSE)})?"
    return StructuredOutputsParams(regex=f"{block}{SPACE}(?:{structure.pattern()})")


def harmony_unread(chat_template, reasoning_parser: str | None) -> str | None:
    """What a user should know where a model writes harmony (its chat template names the analysis channel)
    and its replies are not read as such, else None."""
    if reasoning_parser != HARMONY and f"{CHANNEL}analysis" in str(chat_template or ""):
        return ("this model writes GPT-OSS's harmony channels: without --reasoning-parser openai_gptoss its "
                "analysis (reasoning) and its final answer come back run together as one text")
    return None


def split_harmony(text: str) -> tuple[str | None, str | None]:
    """A finished GPT-OSS reply's (special tokens kept) reasoning and content, None where empty."""
    reasoning, content = _harmony(text, final=True)
    return reasoning or None, content or None


class HarmonyStream(ReasoningStream):
    """`split_harmony` as text arrives (`ReasoningStream`'s feed and finish); `calls`: messages to functions
    go to the content whole (the module's docstring)."""

    def __init__(self, calls: bool = False):
        super().__init__()
        self.calls = calls

    def feed(self, text: str) -> tuple[str, str]:
        self.text += text
        return self._new(*_harmony(self.text, final=False, calls=self.calls))

    def finish(self) -> tuple[str, str]:
        return self._new(*_harmony(self.text, final=True, calls=self.calls))


def harmony_function(header: str) -> str | None:
    """The function a message header calls (`get_weather` of `to=functions.get_weather`), None where it
    addresses none (no recipient, or a built-in tool such as `browser.search`): the recipient is written
    after the channel (`<|channel|>commentary to=functions.f <|constrain|>json`) or before it
    (`<|start|>assistant to=functions.f<|channel|>commentary json`)."""
    m = _RECIPIENT.search(header)
    return m.group(1).removeprefix("functions.") if m and m.group(1).startswith("functions.") else None


def check_parser(name: str | None) -> None:
    """A ValueError unless `name` is one of PARSERS (or None: no parser)."""
    if name not in (None, *PARSERS):
        raise ValueError(f"reasoning_parser must be one of {', '.join(PARSERS)} (or None), got {name!r}")


def _harmony(text: str, final: bool, calls: bool = False) -> tuple[str, str]:
    """(reasoning, content), each whole where `final`, else the part of it certain already: a body's tail that
    may be a marker's start is held back, and so is a header until its `<|message|>`, and with `calls` a
    message to a function until it ends."""
    parts: dict[bool, list[str]] = {True: [], False: []}  # analysis or not -> bodies
    pos = 0
    while pos < len(text):
        start = text.find(MESSAGE, pos)
        if start < 0:  # no more bodies: plain text (a reply with no harmony, at its end), or a header
            rest = text[pos:]
            if final and (pos == 0 or "<|" not in rest):
                parts[False].append(rest)
            elif not final and pos == 0 and "<|" not in rest:
                sure = rest[:len(rest) - _held(rest)]
                parts[False].append("" if _FIRST_RECIPIENT.fullmatch(sure) else sure)
            break  # (else a header still being written, or one cut off: no body yet)
        header, begin = text[pos:start], start + len(MESSAGE)
        ends = [(i, m) for m in MESSAGE_ENDS if (i := text.find(m, begin)) >= 0]
        end, marker = min(ends) if ends else (len(text), "")
        body, pos = text[begin:end], end + len(marker)
        if calls and harmony_function(header) is not None:
            if marker or final:  # (whole, with its header written as the format reads it)
                parts[False].append(("" if header.startswith("<|start|>") else START) + header + MESSAGE + body
                                    + marker)
            continue
        if not marker and not final:
            body = body[:len(body) - _held(body)]
        parts[_channel(header) == "analysis"].append(body)
    # (bodies of one kind joined by a newline, once the later one has text: each stream only grows)
    return ("\n".join(b for b in parts[True] if b), "\n".join(b for b in parts[False] if b))


def _channel(header: str) -> str | None:
    """The channel a message header names (`<|start|>assistant<|channel|>final`, `<|channel|>commentary
    to=functions.f <|constrain|>json`), None where it names none."""
    at = header.find(CHANNEL)
    if at < 0:
        return None
    name = header[at + len(CHANNEL):].split("<|")[0].split()
    return name[0] if name else None


def _held(text: str) -> int:
    """How many characters at text's end may still become a marker (`<|...|>`)."""
    at = text.rfind("<|")
    if at >= 0 and "|>" not in text[at:]:
        return len(text) - at
    return 1 if text.endswith("<") else 0
