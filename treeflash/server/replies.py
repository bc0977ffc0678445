"""One chat choice's text as the client gets it: the reasoning split off first (where the server has a
reasoning parser), then tool calls read from what follows it (where the request gave tools). A call
written inside the reasoning is thought, not called."""

from __future__ import annotations

from treeflash.reasoning import ReasoningStream
from treeflash.tool_calls import ToolCall, ToolCallStream


class ReplyReader:
    def __init__(self, reasoning: ReasoningStream | None, tools: ToolCallStream | None):
        self.reasoning, self.tools = reasoning, tools

    @property
    def calls(self) -> int:
        """Calls read so far."""
        return self.tools.calls if self.tools is not None else 0

    def feed(self, text: str) -> tuple[str, str, list[ToolCall]]:
        """The reasoning, content and completed calls certain now (deltas)."""
        reasoning, content = self.reasoning.feed(text) if self.reasoning is not None else ("", text)
        return (reasoning, *self.tools.feed(content)) if self.tools is not None else (reasoning, content, [])

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        """What was held back, at the choice's end."""
        reasoning, content = self.reasoning.finish() if self.reasoning is not None else ("", "")
        if self.tools is None:
            return reasoning, content, []
        text, calls = self.tools.feed(content)
        rest, more = self.tools.finish()
        return reasoning, text + rest, calls + more
