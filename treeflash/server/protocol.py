"""The OpenAI wire format: request bodies (validated strictly) and response bodies.

Requests are parsed in strict mode: a string where a number belongs, a bool where an integer belongs
or a NaN is an error, not a coercion. Unknown fields are ignored (clients send many optional ones);
fields this server cannot honour (a grammar, beam search and the other vLLM extensions in `UNSUPPORTED`)
are refused by name in `frontend.py` unless left at a value that changes nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TokenIds = list[int]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


# OpenAI's and vLLM's request fields that change what is generated and that this server cannot honour, with
# the values that change nothing; any other value is refused by name (`Frontend`), never ignored. They arrive
# as extra fields (`SamplingFields.model_extra`).
UNSUPPORTED: dict[str, tuple] = {
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "guided_grammar": (),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "spaces_between_special_tokens": (True,),
}
# Those of one endpoint: how vLLM builds the prompt there (the neutral values are what this server does).
CHAT_UNSUPPORTED: dict[str, tuple] = {
    "add_special_tokens": (False,),
    "chat_template": (),  # (a template of the client's own: vLLM too refuses it unless told to trust requests)
    "echo": (False,),
}
COMPLETION_UNSUPPORTED: dict[str, tuple] = {
    "add_special_tokens": (True,),
    "tools": ([],),  # (chat's: a prompt of text has no template to show them)
    "tool_choice": ("none", "auto"),
}


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingFields(_Request):
    """Fields shared by both endpoints (OpenAI's, plus vLLM's top_k / min_p / ignore_eos extensions)."""

    model_config = ConfigDict(extra="allow")  # kept in `model_extra`, so UNSUPPORTED ones can be refused

    model: str | None = None  # None: the one model served
    n: int = Field(1, ge=1)
    # None (every sampling field here): the model's default (its generation_config.json), else OpenAI's / vLLM's
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # -1 or 0: off
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0, lt=1 << 64)  # as SamplingParams (a seeded n gives seed + j)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # OpenAI's penalties and vLLM's repetition_penalty (ranges checked by SamplingParams: 400s that name them)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # OpenAI's: token ids (as JSON's string keys) -> bias in [-100, 100]
    min_tokens: int | None = Field(None, ge=0)  # vLLM's: no stop before this many tokens
    allowed_token_ids: list[int] | None = None  # vLLM's: only these tokens can be generated
    bad_words: list[str] | None = None  # vLLM's: words never generated (treeflash/bad_words.py)
    include_stop_str_in_output: bool = False  # vLLM's: a stop string that ends the text stays in it
    skip_special_tokens: bool = True  # vLLM's: False writes special tokens into the text too
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens (-1: as many as fit)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored, as OpenAI's abuse-tracking tag
    # Chat: logprobs true / false and top_logprobs 0..20; completions: logprobs 0..20 (`Frontend._logprobs`).
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    # vLLM's: each prompt token's log-prob (but the first's) with this many of the most likely tokens' (0..20);
    # not with stream (as vLLM). The response's `prompt_logprobs` (a choice's here, the body's in chat) holds them.
    prompt_logprobs: int | None = None
    # What the reply must be (at most one of them; `Frontend._structure`): OpenAI's response_format (json_schema,
    # json_object or text), vLLM's guided_* fields and their newer structured_outputs {json|regex|choice}.
    response_format: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    structured_outputs: dict | None = None
    guided_whitespace_pattern: str | None = None  # (the whitespace a JSON structure allows between tokens)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    echo: bool = False  # the choice's text (and with logprobs, its log-prob lists) starts with the prompt's
    best_of: int | None = None
    suffix: str | None = None


class TextPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    name: str = Field(min_length=1)
    arguments: str  # a JSON object, as OpenAI sends it (`Frontend` checks it and hands the template a dict)


class MessageToolCall(_Request):
    """A call an earlier assistant message made (OpenAI's `tool_calls` entry)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None: only an assistant message with tool calls
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant message's
    tool_call_id: str | None = None  # a tool message's: the call it answers
    # An earlier reply's reasoning, as this server returns it (vLLM's two names), for templates that show it
    # again inside a tool loop (Qwen3's reads `reasoning_content`, GPT-OSS's `thinking`: `_template_message`)
    reasoning: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot have tool_calls (only an assistant message)")
        if (self.reasoning is not None or self.reasoning_content is not None) and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot have reasoning (only an assistant message)")
        if None not in (self.reasoning, self.reasoning_content) and self.reasoning != self.reasoning_content:
            raise ValueError("reasoning and reasoning_content differ; give one")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content" + (" or tool_calls"
                                                                        if self.role == "assistant" else ""))
        return self

    def text(self) -> str:
        # Text parts on lines of their own, as vLLM joins them (the same prompt as there).
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class FunctionDefinition(_Request):
    model_config = ConfigDict(extra="allow")  # (newer OpenAI fields go to the template as they came)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")  # OpenAI's rule
    description: str | None = None
    parameters: dict | None = None  # a JSON Schema object, shown to the model as it is
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: dict


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    # "auto" (the default with tools): the model may answer or call; "none": the tools are not shown to it;
    # "required" and a named function hold the reply to call blocks (a structured output: `Frontend._tools`).
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # False: a reply's first call only
    # vLLM's, for the chat template (`LLM.chat_token_ids`)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    documents: list[dict] | None = None
    # OpenAI's: how long a reasoning model thinks, for a chat template that takes it (GPT-OSS's: its system
    # message's "Reasoning: ..."); refused where the template does not (`Frontend._chat_ids`)
    reasoning_effort: Literal["low", "medium", "high"] | None = None


class TokenizeRequest(_Request):
    """vLLM's /tokenize: a completion prompt, or chat messages with the chat endpoint's prompt fields."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    documents: list[dict] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: TokenIds


# --- responses ------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens an earlier prompt's prefill had left in the caches (prefix reuse)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    """The completions endpoint's (legacy) format: per token its text, log-prob, the most likely tokens'
    {text: log-prob} and its character offset in the choice's text."""

    text_offset: list[int]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token (nothing predicts it)
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class PromptLogprob(BaseModel):
    """vLLM's entry of a prompt token (or one of the most likely there), keyed by token id."""

    logprob: float
    rank: int
    decoded_token: str | None


# vLLM's prompt_logprobs: per prompt token, None for the first, else {token id: entry}
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None  # vLLM's: the stop string or stop token id that ended the choice
    prompt_logprobs: PromptLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None: a reply of tool calls (or reasoning) alone
    tool_calls: list[ToolCallOut] = []
    # With --reasoning-parser: the <think> block's text, under vLLM's name and its former one (still read
    # by many clients); None where the reply has no reasoning or the server no parser.
    reasoning: str | None = None
    reasoning_content: str | None = None


class DeltaToolCall(ToolCallOut):
    index: int  # the call's place in the choice's calls (a call comes whole, in one chunk)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None  # vLLM's, as CompletionChoice's


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning: str | None = None  # (and reasoning_content, the same: see AssistantMessage)
    reasoning_content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "treeflash"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
