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
reasoning; every other channel's (final, and commentary: preambles, and tool calls, which are not read as
calls here) the content; a header is neither. A reply with no message at all is content (its text
streamed as it comes where it has no marker, else at its end), as is plain text after a message's end.
"""

from __future__ import annotations

import re

from treeflash.structured import StructuredOutputsParams

OPEN, CLOSE = "<think>", "</think>"
HARMONY = "openai_gptoss"  # vLLM's name of GPT-OSS's
PARSERS = ("qwen3", "deepseek_r1", HARMONY)  # vLLM's names; the first two models write the same block
MESSAGE, MESSAGE_ENDS, CHANNEL = "<|message|>", ("<|end|>", "<|return|>", "<|call|>"), "<|channel|>"
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


def split_harmony(text: str) -> tuple[str | None, str | None]:
    """A finished GPT-OSS reply's (special tokens kept) reasoning and content, None where empty."""
    reasoning, content = _harmony(text, final=True)
    return reasoning or None, content or None


class HarmonyStream(ReasoningStream):
    """`split_harmony` as text arrives (`ReasoningStream`'s feed and finish)."""

    def feed(self, text: str) -> tuple[str, str]:
        self.text += text
        return self._new(*_harmony(self.text, final=False))

    def finish(self) -> tuple[str, str]:
        return self._new(*_harmony(self.text, final=True))


def _harmony(text: str, final: bool) -> tuple[str, str]:
    """(reasoning, content), each whole where `final`, else the part of it certain already: a body's tail that
    may be a marker's start is held back, and so is a header until its `<|message|>`."""
    parts: dict[bool, list[str]] = {True: [], False: []}  # analysis or not -> bodies
    pos = 0
    while pos < len(text):
        start = text.find(MESSAGE, pos)
        if start < 0:  # no more bodies: plain text (a reply with no harmony, at its end), or a header
            rest = text[pos:]
            if final and (pos == 0 or "<|" not in rest):
                parts[False].append(rest)
            elif not final and pos == 0 and "<|" not in rest:
                parts[False].append(rest[:len(rest) - _held(rest)])
            break  # (else a header still being written, or one cut off: no body yet)
        header, begin = text[pos:start], start + len(MESSAGE)
        ends = [(i, m) for m in MESSAGE_ENDS if (i := text.find(m, begin)) >= 0]
        if ends:
            end, marker = min(ends)
            body, pos = text[begin:end], end + len(marker)
        else:
            body, pos = text[begin:], len(text)
            if not final:
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
