"""From an OpenAI request body to validated engine requests (or the 4xx that says what is wrong).

Runs on one worker thread of its own (`app.py`), off the event loop, so that tokenising a long prompt
holds up no other client's stream; with a tokenizer instance of its own, as the engine thread decodes
with the LLM's, and Hugging Face fast tokenizers must not be used from two threads at once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

from treeflash.checkpoint import load_tokenizer
from treeflash.engine import Request
from treeflash.llm import LLM, ChatFieldError
from treeflash.logprobs import MAX_LOGPROBS
from treeflash.reasoning import HARMONY, HarmonyStream, ReasoningStream, check_parser, reasoning_structure, \
    starts_in_reasoning
from treeflash.sampling import SamplingParams, truncate_prompt
from treeflash.server.errors import APIError, bad_request
from treeflash.server.protocol import (CHAT_UNSUPPORTED, COMPLETION_UNSUPPORTED, UNSUPPORTED, ChatCompletionRequest,
                                       ChatMessage, CompletionRequest, DetokenizeRequest, NamedToolChoice,
                                       SamplingFields, TokenizeRequest)
from treeflash.server.replies import ReplyReader
from treeflash.structured import StructuredOutputsParams
from treeflash.tool_calls import FORMATS, ToolCallFormat, ToolCallStream, call_structure, \
    tool_call_format

CONTEXT = "context_length_exceeded"


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the name clients must send as `model` (and /v1/models lists)
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <api_key>`
    max_choices: int = 16  # prompts x n of one call, at most
    shutdown_timeout: float = 30.0  # seconds in-flight requests get to finish on SIGINT/SIGTERM
    max_request_bytes: int = 16 << 20  # a larger body is refused (413) before it is read or parsed
    # "qwen3" / "deepseek_r1": chat replies' <think> block as `reasoning`; "openai_gptoss": GPT-OSS's analysis channel
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None  # a name of tool_calls.FORMATS ("hermes", ...); None: the chat template's
    stored_responses: int = 1024  # /v1/responses kept in memory for previous_response_id (the newest)


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str | None


class Frontend:
    def __init__(self, llm: LLM, config: ServerConfig):
        check_parser(config.reasoning_parser)
        if config.tool_call_parser == "openai" and config.reasoning_parser != HARMONY:
            raise ValueError("tool_call_parser 'openai' reads GPT-OSS's harmony messages, which needs "
                             "reasoning_parser 'openai_gptoss' as well")
        if config.tool_call_parser not in (None, *FORMATS):
            raise ValueError(f"tool_call_parser must be one of {', '.join(FORMATS)} (or None: the chat template "
                             f"says), got {config.tool_call_parser!r}")
        self.llm, self.config = llm, config
        self.tokenizer = load_tokenizer(llm.model_dir) if llm.tokenizer is not None else None
        if self.tokenizer is not None:  # (the LLM's --chat-template, where one replaced the model's)
            self.tokenizer.chat_template = llm.tokenizer.chat_template
        self._structure_tokenizer = None  # the structure thread's own, loaded at its first compile

    # --- the two endpoints -----------------------------------------------------------------------
    def completion_requests(self, body: CompletionRequest) -> tuple[list[Request], list[str] | None]:
        """Engine requests for every prompt x n choices (choice index = prompt index x n + j), and with echo
        each choice's prompt text (a token-id prompt's decoded), which its text starts with."""
        self._check_common(body, COMPLETION_UNSUPPORTED)
        if body.suffix not in (None, ""):
            raise bad_request("suffix is not supported", param="suffix", code="unsupported")
        if body.best_of not in (None, 1, body.n):
            raise bad_request("best_of is not supported (use n)", param="best_of", code="unsupported")
        prompts = self._truncated(body, self._completion_prompts(body.prompt))
        requests = self._requests(body, prompts, body.max_completion_tokens or body.max_tokens, default_max_tokens=16)
        if not body.echo:
            return requests, None
        texts = {id(p): p.text if p.text is not None else self._decode(p.ids) for p in prompts}
        return requests, [texts[id(p)] for p in prompts for _ in range(body.n)]

    def chat_requests(self, body: ChatCompletionRequest) -> tuple[list[Request], Callable[[], ReplyReader] | None]:
        """The engine requests (n choices), and where the replies are read for reasoning or tool calls, what
        reads one."""
        self._check_common(body, CHAT_UNSUPPORTED)
        tools = self._tools(body)
        tok = self._need_tokenizer("messages")
        ids = self._chat_ids(body, tools, tok)
        fmt = forced = None
        harmony = self.config.reasoning_parser == HARMONY  # (its channels' markers are special tokens: kept)
        if tools is not None:
            fmt = self._tool_format(tok).for_tools(tools)
            if fmt is FORMATS["openai"] and not harmony:
                raise bad_request("this model writes its tool calls as harmony messages (GPT-OSS), which are read "
                                  "with --reasoning-parser openai_gptoss: restart the server with it",
                                  param="tools", code="unsupported")
            forced = self._forced_call(body, tools, fmt)
            if forced is not None:
                fmt = fmt.forced()
        inside = None  # (no <think> block to read)
        if self.config.reasoning_parser is not None and not harmony:
            inside = starts_in_reasoning(tok.decode(ids[-32:]))  # (the generation prompt is in the last tokens)
        max_tokens = body.max_completion_tokens or body.max_tokens
        requests = self._requests(body, self._truncated(body, [Prompt(ids, None)]), max_tokens,
                                  default_max_tokens=None, forced=forced, reasoning_inside=inside,
                                  keep_special_tokens=harmony or (fmt is not None and fmt.keeps_special_tokens))
        if tools is None and inside is None and not harmony:
            return requests, None
        calls = fmt is FORMATS["openai"]  # (read out of the harmony messages whole)
        return requests, lambda: ReplyReader(HarmonyStream(calls) if harmony else None if inside is None
                                             else ReasoningStream(inside),
                                             None if fmt is None else ToolCallStream(body.parallel_tool_calls, fmt))

    def compile_structures(self, requests: list[Request], body: SamplingFields) -> None:
        """The structured requests' automata (the endpoints leave them out), on the server's structure thread
        so that a compile of seconds holds up no other request's validation; a compile that fails is the 400
        of the field that asked for the structure."""
        if self._structure_tokenizer is None:  # (a tokenizer is one thread's: this one reads the vocabulary)
            self._structure_tokenizer = load_tokenizer(self.llm.model_dir)
        try:
            self.llm.compile_structures(requests, tokenizer=self._structure_tokenizer)
        except ValueError as e:
            forced = isinstance(body, ChatCompletionRequest) and body.tools and self._forces_call(body)
            raise bad_request(str(e), param="tool_choice" if forced else self._structure(body)[1]) from None

    def _chat_ids(self, body: ChatCompletionRequest | TokenizeRequest, tools: list[dict] | None, tok) -> list[int]:
        """The chat prompt's token ids under the model's template, or the 400 that says what it refused."""
        messages = [_template_message(m, i) for i, m in enumerate(body.messages)]
        kwargs = _with_reasoning_effort(body.chat_template_kwargs, getattr(body, "reasoning_effort", None), tok)
        try:
            return self.llm.chat_token_ids(
                messages, tokenizer=tok, tools=tools, documents=body.documents,
                add_generation_prompt=body.add_generation_prompt, continue_final_message=body.continue_final_message,
                chat_template_kwargs=kwargs)
        except ChatFieldError as e:
            raise bad_request(str(e), param=e.field, code="unsupported" if e.unsupported else "invalid_value") from None
        except ValueError as e:  # no chat template, or a message it cannot render
            raise bad_request(str(e), param="messages") from None
        except Exception as e:  # noqa: BLE001 (a template may raise anything: it is the model's code)
            raise bad_request(f"the chat template refused these messages: {e}", param="messages") from None

    @staticmethod
    def _tools(body: ChatCompletionRequest) -> list[dict] | None:
        """The tools to show the model (None: none, or tool_choice "none")."""
        choice = body.tool_choice
        if not body.tools or choice == "none":
            if Frontend._forces_call(body):
                raise bad_request("tool_choice forces a call, but no tools were given", param="tool_choice")
            return None
        tools = [t.model_dump(exclude_none=True) for t in body.tools]
        if isinstance(choice, NamedToolChoice) and choice.function.get("name") not in {
                t["function"]["name"] for t in tools}:
            raise bad_request(f"tool_choice names {choice.function.get('name')!r}, which is not one of the tools",
                              param="tool_choice")
        return tools

    def _tool_format(self, tok) -> ToolCallFormat:
        """The format replies' calls are read in: the server's --tool-call-parser, else the chat template's."""
        if self.config.tool_call_parser is not None:
            return FORMATS[self.config.tool_call_parser]
        try:
            return tool_call_format(tok.chat_template)
        except ValueError as e:
            raise bad_request(str(e), param="tools", code="unsupported") from None

    @staticmethod
    def _forced_call(body: ChatCompletionRequest, tools: list[dict], fmt: ToolCallFormat
                     ) -> StructuredOutputsParams | None:
        """Where tool_choice forces a call ("required", or a named function), the structure that holds the
        reply to calls in the format `fmt`."""
        if not Frontend._forces_call(body):
            return None
        if not fmt.can_force:
            raise bad_request(f"tool_choice cannot force a call in the {fmt.name!r} format: a call's header is "
                              f"special tokens, which a structured output's text never holds; use \"auto\"",
                              param="tool_choice", code="unsupported")
        choice = body.tool_choice
        name = choice.function.get("name") if isinstance(choice, NamedToolChoice) else None
        try:
            return call_structure(tools, name, several=name is None and body.parallel_tool_calls, fmt=fmt)
        except ValueError as e:  # (a parameters schema outlines-core cannot translate)
            raise bad_request(str(e), param="tools") from None

    @staticmethod
    def _forces_call(body: ChatCompletionRequest) -> bool:
        return body.tool_choice == "required" or isinstance(body.tool_choice, NamedToolChoice)

    def tokenize(self, body: TokenizeRequest) -> list[int]:
        """The prompt token ids the server's endpoints would run for this prompt or these messages."""
        self.check_model(body.model)
        if body.prompt is not None:
            return self._encode(body.prompt)
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        return self._chat_ids(body, tools, self._need_tokenizer("messages"))

    def detokenize(self, body: DetokenizeRequest) -> str:
        self.check_model(body.model)
        vocab = self.llm.config.vocab_size
        if not all(0 <= t < vocab for t in body.tokens):
            raise bad_request(f"tokens has ids outside the vocabulary [0, {vocab})", param="tokens")
        return self._need_tokenizer("tokens").decode(body.tokens)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.config.model_name!r}",
                           param="model", code="model_not_found")

    # --- shared checks ---------------------------------------------------------------------------
    def _check_common(self, body: SamplingFields, endpoint_unsupported: dict[str, tuple]) -> None:
        self.check_model(body.model)
        if body.stream_options is not None and not body.stream:
            raise bad_request("stream_options is only allowed with stream: true", param="stream_options")
        for name, value in (body.model_extra or {}).items():
            neutral = endpoint_unsupported.get(name, UNSUPPORTED.get(name))
            if neutral is not None and value is not None and not _same(value, neutral):
                raise bad_request(f"{name} is not supported", param=name, code="unsupported")

    def _truncated(self, body: SamplingFields, prompts: list[Prompt]) -> list[Prompt]:
        """The prompts as vLLM's truncate_prompt_tokens keeps them (before the context checks); a cut prompt's
        text is its kept tokens' (an echo shows what the model saw)."""
        try:  # (its check is SamplingParams')
            k = SamplingParams(truncate_prompt_tokens=body.truncate_prompt_tokens).truncate_prompt_tokens
        except ValueError as e:
            raise bad_request(str(e), param="truncate_prompt_tokens") from None
        kept = [truncate_prompt(p.ids, k, self.llm.max_model_len) for p in prompts]
        return [p if len(ids) == len(p.ids) else Prompt(ids, None) for p, ids in zip(prompts, kept)]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False) if self.tokenizer is not None else ""

    def _completion_prompts(self, prompt) -> list[Prompt]:
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt is empty", param="prompt")
        out = []
        for p in prompt:
            if isinstance(p, str):
                out.append(Prompt(self._encode(p), p))
            else:
                out.append(Prompt(list(p), None))
        vocab = self.llm.config.vocab_size
        for p in out:
            if not p.ids:
                raise bad_request("prompt is empty", param="prompt")
            if not all(0 <= t < vocab for t in p.ids):
                raise bad_request(f"prompt has token ids outside the vocabulary [0, {vocab})", param="prompt")
        return out

    def _requests(self, body: SamplingFields, prompts: list[Prompt], max_tokens: int | None,
                  default_max_tokens: int | None, forced: StructuredOutputsParams | None = None,
                  reasoning_inside: bool | None = None, keep_special_tokens: bool = False) -> list[Request]:
        """reasoning_inside: with a reasoning parser, whether the replies start inside their reasoning block
        (a structure then holds the answer after the block); None: no parser. keep_special_tokens: write
        special tokens into the text whatever skip_special_tokens says (where tool calls' markup is one)."""
        choices = len(prompts) * body.n
        if choices > self.config.max_choices:
            raise bad_request(f"n x prompts is {choices}; at most {self.config.max_choices} choices per request",
                              param="n")
        if body.seed is not None and body.seed + body.n > 1 << 64:
            raise bad_request(f"with n = {body.n}, seed must be at most 2**64 - n = {(1 << 64) - body.n} (choice j "
                              f"gets seed + j), got {body.seed}", param="seed")
        structure, source = self._structure(body, forced)
        limit = self.llm.max_model_len
        params = []
        for p in prompts:
            room = limit - len(p.ids)
            if room < 1:
                raise bad_request(f"the prompt has {len(p.ids)} tokens; this model's context is {limit} tokens "
                                  f"and at least one must be left to generate", param="messages"
                                  if isinstance(body, ChatCompletionRequest) else "prompt", code=CONTEXT)
            if max_tokens is not None and max_tokens > room:
                raise bad_request(f"the prompt has {len(p.ids)} tokens and {max_tokens} more were asked for; "
                                  f"this model's context is {limit} tokens", param="max_tokens", code=CONTEXT)
            # (the model's max_new_tokens caps the default, as in vLLM; an asked max_tokens stands)
            fallback = min(default_max_tokens or room, self.llm.default_sampling.get("max_tokens", room), room)
            base = self._sampling(body, max_tokens or fallback, self._logprobs(body),
                                  self._prompt_logprobs(body), structure, source, keep_special_tokens)
            if reasoning_inside is not None and base.structured_outputs is not None:
                try:
                    base = dataclasses.replace(base, structured_outputs=reasoning_structure(
                        base.structured_outputs, reasoning_inside))
                except ValueError as e:  # (a JSON schema outlines-core cannot translate)
                    raise bad_request(str(e), param=source) from None
            for j in range(body.n):  # n choices = n requests; a seeded call gives choice j seed + j
                params.append(base if body.seed is None else dataclasses.replace(base, seed=body.seed + j))
        ids = [p.ids for p in prompts for _ in range(body.n)]
        texts = [p.text for p in prompts for _ in range(body.n)]
        try:
            return self.llm.new_requests(ids, params, texts, tokenizer=self.tokenizer, compile_structures=False)
        except ValueError as e:
            field = source if str(e).startswith("structured outputs") else str(e).split(" ", 1)[0]
            raise bad_request(str(e), param=field if field in SamplingFields.model_fields else None) from None

    @staticmethod
    def _structure(body: SamplingFields, forced: StructuredOutputsParams | None = None
                   ) -> tuple[StructuredOutputsParams | dict | None, str | None]:
        """What the reply must be, and the field that says so: at most one of response_format (json_schema or
        json_object), vLLM's guided_json / guided_regex / guided_choice / structured_outputs, and a forced tool
        call (tool_choice)."""
        given = []
        if forced is not None:
            given.append(("tool_choice", forced))
        form = body.response_format
        if form is not None:
            kind = form.get("type")
            if kind == "json_object":
                given.append(("response_format", {"json_object": True}))
            elif kind == "json_schema":
                spec = form.get("json_schema")
                schema = spec.get("schema") if isinstance(spec, dict) else None
                if not isinstance(schema, dict):
                    raise bad_request("response_format json_schema needs json_schema.schema, a JSON schema object",
                                      param="response_format")
                given.append(("response_format", {"json": schema}))
            elif kind != "text":
                raise bad_request(f"response_format type must be text, json_object or json_schema, got {kind!r}",
                                  param="response_format")
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice")):
            if getattr(body, name) is not None:
                given.append((name, {key: getattr(body, name)}))
        if body.structured_outputs is not None:
            given.append(("structured_outputs", body.structured_outputs))
        if len(given) > 1:
            raise bad_request(f"{' and '.join(name for name, _ in given)} each say what the reply must be; give one",
                              param=given[1][0])
        source, structure = given[0] if given else (None, None)
        if body.guided_whitespace_pattern is not None:
            if not isinstance(structure, dict) or structure.get("json") is None and not structure.get("json_object"):
                raise bad_request("guided_whitespace_pattern shapes a JSON reply: it needs response_format (json_schema "
                                  "or json_object), guided_json or structured_outputs.json",
                                  param="guided_whitespace_pattern")
            structure = {**structure, "whitespace_pattern": body.guided_whitespace_pattern}
        return structure, source

    @staticmethod
    def _logprobs(body: SamplingFields) -> int | None:
        """SamplingParams.logprobs from OpenAI's fields: chat's logprobs (a bool) and top_logprobs, or the
        completions endpoint's logprobs (how many of the most likely tokens; 0: the generated one alone)."""
        chat = isinstance(body, ChatCompletionRequest)
        value, top = body.logprobs, body.top_logprobs
        if chat:
            if value is not None and not isinstance(value, bool):
                raise bad_request(f"logprobs must be true or false here (top_logprobs says how many), got {value!r}",
                                  param="logprobs")
            if top is not None and not 0 <= top <= MAX_LOGPROBS:
                raise bad_request(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}", param="top_logprobs")
            if top and not value:
                raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
            return (top or 0) if value else None
        if top is not None:
            raise bad_request("top_logprobs belongs to /v1/chat/completions; here logprobs says how many",
                              param="top_logprobs")
        if isinstance(value, bool) or (value is not None and not 0 <= value <= MAX_LOGPROBS):
            raise bad_request(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] here, got {value!r}",
                              param="logprobs")
        return value

    def _prompt_logprobs(self, body: SamplingFields) -> int | None:
        """SamplingParams.prompt_logprobs: vLLM's field, or with echo the completions endpoint's logprobs (an
        echoed prompt's tokens get their entries as the generated ones do), whichever asks for more."""
        asked = body.prompt_logprobs
        if asked is not None and body.stream:
            raise bad_request("prompt_logprobs is not available with stream: true (as in vLLM)",
                              param="prompt_logprobs")
        if isinstance(body, CompletionRequest) and body.echo and body.logprobs is not None:  # (checked: an int)
            return body.logprobs if asked is None else max(asked, body.logprobs)
        return asked

    def _sampling(self, body: SamplingFields, max_tokens: int, logprobs: int | None = None,
                  prompt_logprobs: int | None = None, structure: StructuredOutputsParams | dict | None = None,
                  source: str | None = None, keep_special_tokens: bool = False) -> SamplingParams:
        """The request's SamplingParams; a field it leaves out takes the model's default (its
        generation_config.json's, `LLM.default_sampling`), else OpenAI's / vLLM's."""
        model = self.llm.default_sampling

        def default(field: str, value, neutral):
            return value if value is not None else model.get(field, neutral)

        try:
            return SamplingParams(
                temperature=default("temperature", body.temperature, 1.0),
                top_p=default("top_p", body.top_p, 1.0),
                top_k=default("top_k", body.top_k, -1),  # (0 = off, as in vLLM: SamplingParams says so)
                min_p=default("min_p", body.min_p, 0.0),
                max_tokens=max_tokens, seed=body.seed, stop=body.stop, stop_token_ids=body.stop_token_ids,
                ignore_eos=body.ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                truncate_prompt_tokens=body.truncate_prompt_tokens,
                presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
                repetition_penalty=default("repetition_penalty", body.repetition_penalty, 1.0),
                logit_bias=_token_bias(body.logit_bias), min_tokens=body.min_tokens or 0,
                allowed_token_ids=body.allowed_token_ids, bad_words=body.bad_words or None,
                include_stop_str_in_output=body.include_stop_str_in_output, structured_outputs=structure,
                skip_special_tokens=body.skip_special_tokens and not keep_special_tokens)
        except ValueError as e:
            field = str(e).split(" ", 1)[0]
            raise bad_request(str(e), param=source if field.startswith("structured_outputs") else field) from None

    def _encode(self, text: str) -> list[int]:
        """A text prompt's token ids, as the engine runs them, or the 400 its tokenizer's error makes."""
        tok = self._need_tokenizer("prompt")
        try:
            return self.llm.encode(text, tokenizer=tok)
        except Exception as e:  # noqa: BLE001 (a lone surrogate, say: the tokenizer's TypeError)
            raise bad_request(f"the prompt cannot be tokenised: {e}", param="prompt") from None

    def _need_tokenizer(self, param: str):
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer: send the prompt as token ids", param=param)
        return self.tokenizer


def _token_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias (JSON keys are strings) with token-id keys."""
    if bias is None:
        return None
    if not all(k.isascii() and k.isdigit() for k in bias):
        raise bad_request("logit_bias keys must be token ids, such as {\"50256\": -100}", param="logit_bias")
    return {int(k): v for k, v in bias.items()}


def _same(value, neutrals: tuple) -> bool:
    """value is one of `neutrals`, type and all (False is not 0, as JSON has it)."""
    return any(type(value) is type(n) and value == n for n in neutrals) or (
        isinstance(value, float) and any(type(n) is int and value == n for n in neutrals))


def _template_message(m: ChatMessage, i: int) -> dict:
    """A message as chat templates take it: OpenAI's "developer" is its newer name for "system", a call's
    arguments go as the object they encode (templates write them out with `tojson`), and an assistant's
    reasoning under the names templates read it by (Qwen3's `reasoning_content`, GPT-OSS's `thinking`)."""
    out = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
    reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
    if reasoning is not None:
        out["reasoning_content"] = out["thinking"] = reasoning
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": _arguments(c.function.arguments, f"messages[{i}].tool_calls[{j}]")}}
            for j, c in enumerate(m.tool_calls)]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.role == "tool" and m.name is not None:
        out["name"] = m.name
    return out


def _with_reasoning_effort(kwargs: dict | None, effort: str | None, tok) -> dict | None:
    """The chat template's kwargs with a request's reasoning_effort among them, or the 400 that says why not:
    a template that never reads it would drop it unseen, and one set twice must agree."""
    if effort is None:
        return kwargs
    if "reasoning_effort" not in str(tok.chat_template or ""):
        raise bad_request("reasoning_effort is not supported by this model's chat template (it reads no "
                          "reasoning_effort; GPT-OSS's does)", param="reasoning_effort", code="unsupported")
    if (kwargs or {}).get("reasoning_effort", effort) != effort:
        raise bad_request("reasoning_effort and chat_template_kwargs.reasoning_effort differ; give one",
                          param="reasoning_effort")
    return {**(kwargs or {}), "reasoning_effort": effort}


def _arguments(text: str, where: str) -> dict:
    try:
        arguments = json.loads(text)
    except ValueError as e:
        raise bad_request(f"{where}.function.arguments is not JSON: {e}", param=f"{where}.function.arguments") from None
    if not isinstance(arguments, dict):
        raise bad_request(f"{where}.function.arguments must encode a JSON object", param=f"{where}.function.arguments")
    return arguments
