"""`treeflash chat`: a conversation with the model in the terminal, one reply streamed at a time.

Each turn's prompt is the whole conversation under the chat template, so with prefix reuse (on by default)
a turn prefills only what the earlier turns' prompts did not already hold in whole 512-token chunks. A
reply is stopped with Ctrl-C between rounds (a flag the loop reads: an engine interrupted inside a round
would be left half-way), and what it said so far stays in the conversation.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time

HELP = """\
/reset  forget the conversation (the system message stays)
/exit   end the chat (Ctrl-D does too, and Ctrl-C at the prompt); Ctrl-C stops a reply
a line ending with a backslash continues on the next line"""


class Chat:
    """The conversation and the turns that add to it (`say`), over one LLM. With a `reasoning_parser`
    (treeflash/reasoning.py's names) a reply's reasoning is shown apart from its answer (dimmed on a
    terminal) and kept beside it in the conversation, where the chat template decides whether the model
    sees it again (Qwen3's and GPT-OSS's do inside a tool loop only)."""

    def __init__(self, llm, params, system: str | None = None, out=None, err=None,
                 reasoning_parser: str | None = None):
        from treeflash.reasoning import HARMONY, check_parser

        check_parser(reasoning_parser)
        if reasoning_parser == HARMONY:  # (its channels' markers are special tokens)
            params = dataclasses.replace(params, skip_special_tokens=False)
        self.llm, self.params, self.system, self.reasoning_parser = llm, params, system, reasoning_parser
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.messages: list[dict] = []
        self._stop = False

    def reset(self) -> None:
        self.messages = []

    def _conversation(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.messages

    def say(self, text: str):
        """Stream the reply to `text`; returns its output (None where the conversation no longer fits)."""
        from treeflash.cli import summary_line

        messages = self._conversation() + [{"role": "user", "content": text}]
        ids = self.llm.chat_token_ids(messages)
        room = self.llm.max_model_len - len(ids)
        if room < 1:
            print(f"the conversation is {len(ids)} tokens, the context {self.llm.max_model_len}: /reset starts "
                  f"a new one", file=self.err)
            return None
        params = dataclasses.replace(self.params, max_tokens=min(self.params.max_tokens, room))
        self._stop, out, shown = False, None, _Shown(self.out, self._reader(ids))
        start = time.perf_counter()
        stream = self.llm.stream(prompt_token_ids=ids, sampling_params=params)
        previous = signal.signal(signal.SIGINT, self._interrupt) if _main_thread() else None
        try:
            for chunk in stream:
                shown.feed(chunk.text)
                out = chunk.output or out
                if self._stop:
                    break
        finally:
            stream.close()  # (aborts the request where the reply was stopped)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        elapsed = time.perf_counter() - start
        shown.finish()
        answer = {"role": "assistant", "content": shown.content}
        if shown.reasoning:  # (under the names templates read it by: Qwen3's, GPT-OSS's)
            answer["reasoning_content"] = answer["thinking"] = shown.reasoning
        self.messages += [{"role": "user", "content": text}, answer]
        if out is None:
            print("(stopped)", file=self.err)
        else:
            spec = self.llm.spec
            looked = spec.ngram_tokens if params.greedy or spec.lookup_sampled(self.llm.device) else 0
            print(summary_line(spec.method, out, elapsed, looked).split("\n")[0], file=self.err)
        return out

    def _interrupt(self, signum, frame) -> None:
        self._stop = True

    def _reader(self, ids: list[int]):
        from treeflash.reasoning import HARMONY, HarmonyStream, ReasoningStream, starts_in_reasoning

        if self.reasoning_parser is None:
            return None
        if self.reasoning_parser == HARMONY:
            return HarmonyStream()
        return ReasoningStream(starts_in_reasoning(self.llm.tokenizer.decode(ids[-32:])))


class _Shown:
    """A reply as it is written out: its reasoning (dimmed on a terminal) and then its answer, a line apart;
    everything as it came where there is no reader."""

    def __init__(self, out, reader):
        self.out, self.reader = out, reader
        self.reasoning = self.content = ""
        self.dim = ("\x1b[2m", "\x1b[0m") if getattr(out, "isatty", lambda: False)() else ("", "")

    def feed(self, text: str) -> None:
        self._write(*(self.reader.feed(text) if self.reader is not None else ("", text)))

    def finish(self) -> None:
        if self.reader is not None:
            self._write(*self.reader.finish())
        self.out.write("\n")
        self.out.flush()

    def _write(self, reasoning: str, content: str) -> None:
        if reasoning:
            self.out.write(self.dim[0] + reasoning + self.dim[1])
            self.reasoning += reasoning
        if content:
            if self.reasoning and not self.content:
                self.out.write("\n\n")
            self.out.write(content)
            self.content += content
        self.out.flush()


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def read_message(prompt: str, interactive: bool) -> str | None:
    """One message from standard input (lines ending with a backslash go on); None at its end."""
    lines = []
    while True:
        try:
            line = input(prompt if interactive else "")
        except EOFError:
            return "\n".join(lines) if lines else None
        if line.endswith("\\"):
            lines.append(line[:-1])
            prompt = "... "
            continue
        return "\n".join(lines + [line])


def run(chat: Chat, name: str) -> int:
    """The chat loop on standard input, until /exit, Ctrl-D or Ctrl-C at the prompt."""
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 (line editing and history for input(), where the platform has it)
        except ImportError:
            pass
        print(f"treeflash chat with {name}: type a message; /help for commands", file=chat.err)
    while True:
        try:
            text = read_message(">>> ", interactive)
        except KeyboardInterrupt:
            print(file=chat.err)
            return 0
        if text is None or text.strip() in ("/exit", "/quit", "/bye"):
            return 0
        if not text.strip():
            continue
        if text.strip() == "/reset":
            chat.reset()
            print("(a new conversation)", file=chat.err)
        elif text.strip() in ("/help", "/?"):
            print(HELP, file=chat.err)
        elif text.startswith("/") and " " not in text.strip():
            print(f"unknown command {text.strip()}\n{HELP}", file=chat.err)
        else:
            chat.say(text)
