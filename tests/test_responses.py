"""POST /v1/responses (OpenAI's Responses API) through `treeflash serve` and the real `openai` client.

A response runs as the chat request it translates into, so each test holds it to offline chat or to the
chat endpoint on the same tiny random model (character tokenizer, a chat template); the streamed events
must build the same response as the plain call. Tool calls with a real model are in test_tool_calls.py.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from helpers import make_tiny_chat_target
from server_helpers import Server
from treeflash import LLM, SamplingParams

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

KEY, NAME, CONTEXT = "test-key", "tiny", 1024
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }}{% for c in m['tool_calls'] or [] %} call "
            "{{ c['function']['name'] }}{% endfor %} {% endfor %}{% if add_generation_prompt %}assistant {% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_chat_target(tmp_path_factory.mktemp("responses") / "chars", TEMPLATE,
                                 max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def server(model_dir):
    srv = Server(str(model_dir), "--max-num-seqs", "4", "--api-key", KEY, "--served-model-name", NAME)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), device="cpu", max_num_seqs=4)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def streamed(client, **kw):
    """The events of a streamed response, checked for what every stream must be, and its last response."""
    events = list(client.responses.create(model=NAME, stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events, events[-1].response


def test_a_text_input_answers_as_offline_chat_streamed_or_not(client, offline):
    want = offline.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a tree"}],
                        greedy(24))[0]
    got = client.responses.create(model=NAME, input="name a tree", instructions="be brief", max_output_tokens=24,
                                  temperature=0)
    assert got.output_text == want.text and got.id.startswith("resp_") and got.model == NAME
    assert [item.type for item in got.output] == ["message"] and got.output[0].role == "assistant"
    truncated = want.finish_reason == "length"
    assert got.status == ("incomplete" if truncated else "completed")
    assert (got.incomplete_details.reason if truncated else got.incomplete_details) == (
        "max_output_tokens" if truncated else None)
    assert got.usage.input_tokens == len(want.prompt_token_ids) and got.usage.output_tokens == len(want.token_ids)
    assert got.usage.total_tokens == got.usage.input_tokens + got.usage.output_tokens
    assert got.instructions == "be brief" and got.temperature == 0 and got.max_output_tokens == 24

    events, final = streamed(client, input="name a tree", instructions="be brief", max_output_tokens=24,
                             temperature=0)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want.text
    kinds = [e.type for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert final.output_text == want.text and final.status == got.status and final.usage == got.usage
    with client.responses.stream(model=NAME, input="name a tree", instructions="be brief", max_output_tokens=24,
                                 temperature=0) as stream:  # (the SDK's helper rebuilds the response from the events)
        assert stream.get_final_response().output_text == want.text


def test_input_items_render_as_the_chat_messages_they_are(client):
    """Messages with text parts, a function call and its output give the prompt and reply that the chat
    endpoint gives the same conversation."""
    items = [{"role": "developer", "content": "be brief"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what time"},
                                                             {"type": "input_text", "text": "is it"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "function_call", "call_id": "c1", "name": "now", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "noon"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "noon"}]},
             {"role": "user", "content": "thanks"}]
    messages = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "what time\nis it"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "noon"}, {"role": "assistant", "content": "noon"},
                {"role": "user", "content": "thanks"}]
    got = client.responses.create(model=NAME, input=items, max_output_tokens=16, temperature=0)
    want = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0)
    assert got.output_text == want.choices[0].message.content
    assert got.usage.input_tokens == want.usage.prompt_tokens


def test_previous_response_id_continues_without_the_instructions(client, offline):
    first = client.responses.create(model=NAME, input="name a tree", instructions="be brief", max_output_tokens=8,
                                    temperature=0)
    second = client.responses.create(model=NAME, input="and a bird", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    want = offline.chat([{"role": "user", "content": "name a tree"}, {"role": "assistant", "content": first.output_text},
                         {"role": "user", "content": "and a bird"}], greedy(8))[0]
    assert second.output_text == want.text and second.previous_response_id == first.id
    third = client.responses.create(model=NAME, input="and a fish", previous_response_id=second.id,
                                    max_output_tokens=8, temperature=0)
    assert third.usage.input_tokens == len(offline.chat_token_ids([
        {"role": "user", "content": "name a tree"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "and a bird"}, {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "and a fish"}]))

    kept = client.responses.retrieve(first.id)
    assert kept.id == first.id and kept.output_text == first.output_text and kept.usage == first.usage
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(model=NAME, input="again", previous_response_id=first.id)
    assert error.value.body["param"] == "previous_response_id"
    assert client.responses.retrieve(second.id).output_text == second.output_text  # (the chain's others stay)

    unstored = client.responses.create(model=NAME, input="name a tree", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    _, final = streamed(client, input="name a tree", max_output_tokens=4)
    assert client.responses.retrieve(final.id).output_text == final.output_text  # (a stream is stored too)


def test_a_stored_responses_input_items_are_listed_as_openai_pages_them(server, client):
    items = [{"role": "developer", "content": "be brief"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what time"}]},
             {"type": "function_call", "call_id": "c1", "name": "now", "arguments": "{}", "id": "fc_given"},
             {"type": "function_call_output", "call_id": "c1", "output": "noon"},
             {"role": "assistant", "content": "noon"}, {"role": "user", "content": "thanks"}]
    made = client.responses.create(model=NAME, input=items, max_output_tokens=4, temperature=0)
    listed = list(client.responses.input_items.list(made.id, order="asc", limit=2))  # (the SDK pages through)
    assert [i.type for i in listed] == ["message", "message", "function_call", "function_call_output", "message",
                                        "message"]
    assert listed[2].id == "fc_given" and len({i.id for i in listed}) == 6  # ids kept, or made where none was
    assert [i.role for i in listed if i.type == "message"] == ["developer", "user", "assistant", "user"]
    assert listed[0].content[0].type == "input_text" and listed[0].content[0].text == "be brief"
    assert listed[4].content[0].type == "output_text"
    newest = client.responses.input_items.list(made.id, limit=4)  # desc by default
    assert [i.id for i in newest.data] == [i.id for i in listed[::-1][:4]] and newest.has_more
    after = client.responses.input_items.list(made.id, limit=4, after=newest.last_id)
    assert [i.id for i in after.data] == [i.id for i in listed[:2][::-1]] and not after.has_more
    rest = client.responses.input_items.list(made.id, order="asc", after=listed[3].id)
    assert [i.id for i in rest.data] == [i.id for i in listed[4:]] and not rest.has_more
    text = client.responses.create(model=NAME, input="hi", max_output_tokens=2)
    only = client.responses.input_items.list(text.id).data
    assert [(i.type, i.role, i.content[0].text) for i in only] == [("message", "user", "hi")]
    auth = {"Authorization": f"Bearer {KEY}"}
    for query, status, param in (("?limit=0", 400, "limit"), ("?order=up", 400, "order"),
                                 ("?after=msg_none", 404, "after")):
        answer = httpx.get(f"{server.url}/v1/responses/{made.id}/input_items{query}", headers=auth)
        assert (answer.status_code, answer.json()["error"]["param"]) == (status, param)
    assert httpx.get(f"{server.url}/v1/responses/resp_none/input_items", headers=auth).status_code == 404
    assert httpx.get(f"{server.url}/v1/responses/{made.id}/input_items").status_code == 401


def test_text_format_and_sampling_extensions_give_the_chat_endpoints_reply(client):
    schema = {"type": "integer"}  # (the character vocabulary has no braces or quotes)
    got = client.responses.create(model=NAME, input="a number", max_output_tokens=40, temperature=0,
                                  text={"format": {"type": "json_schema", "name": "n", "schema": schema}})
    want = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a number"}],
                                          max_tokens=40, temperature=0, response_format={
                                              "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert got.output_text == want.choices[0].message.content
    assert re.fullmatch(r"[0-9]+", got.output_text)

    extra = {"top_k": 5, "seed": 7, "min_p": 0.05, "stop": ["e"]}
    got = client.responses.create(model=NAME, input="name a tree", max_output_tokens=30, temperature=1.0,
                                  extra_body=extra)
    want = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "name a tree"}],
                                          max_tokens=30, temperature=1.0, extra_body=extra)
    assert got.output_text == want.choices[0].message.content and "e" not in got.output_text


def test_logprobs_are_the_chat_endpoints_streamed_or_not(client):
    ask = dict(model=NAME, input="name a tree", max_output_tokens=12, temperature=0, top_logprobs=2,
               include=["message.output_text.logprobs"])
    got = client.responses.create(**ask).output[0].content[0].logprobs
    want = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "name a tree"}],
                                          max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    entries = want.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in got] == [(e.token, e.logprob) for e in entries]
    assert [[(t.token, t.logprob) for t in e.top_logprobs] for e in got] == \
        [[(t.token, t.logprob) for t in e.top_logprobs] for e in entries]
    events, _ = streamed(client, **{k: v for k, v in ask.items() if k != "model"})
    sent = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [(e.token, e.logprob) for e in sent] == [(e.token, e.logprob) for e in entries]


@pytest.mark.parametrize("body, status, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400, "input"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, 400, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, 400, "input"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": "x" * (CONTEXT + 10)}, 400, "input"),
    ({"input": "hi", "max_output_tokens": CONTEXT}, 400, "max_output_tokens"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}, 400, "tools"),
    ({"input": "hi", "tool_choice": {"type": "allowed_tools", "tools": []}}, 400, "tool_choice"),
    ({"input": "hi", "background": True}, 400, "background"),
    ({"input": "hi", "truncation": "auto"}, 400, "truncation"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, 400, "reasoning"),  # (a template that reads none)
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, 400, "reasoning"),
    ({"input": "hi", "reasoning": {"summary": "auto"}}, 400, "reasoning"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text"),
    ({"input": "hi", "text": {"format": {"type": "grammar"}}}, 400, "text"),
    ({"input": "hi", "top_logprobs": 50}, 400, "top_logprobs"),
    ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"input": "hi", "guided_grammar": "root ::= 'a'"}, 400, "guided_grammar"),
    ({"input": "hi", "previous_response_id": "resp_none"}, 404, "previous_response_id"),
    ({"input": "hi", "model": "other"}, 404, "model"),
])
def test_bad_input_gets_its_4xx_and_the_server_keeps_serving(server, client, body, status, param):
    answer = httpx.post(server.url + "/v1/responses", json={"model": NAME, **body},
                        headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()
    assert client.responses.create(model=NAME, input="hi", max_output_tokens=2).status in ("completed", "incomplete")


def test_a_client_leaving_mid_stream_has_its_request_aborted(server):
    def aborted() -> float:
        text = httpx.get(server.url + "/metrics").text
        return float(re.search(r'^treeflash_requests_finished_total\{finish_reason="abort"\} (\S+)$', text,
                               re.MULTILINE).group(1))

    before = aborted()
    body = {"model": NAME, "input": "leaving", "max_output_tokens": CONTEXT - 100, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as answer:
        assert next(line for line in answer.iter_lines() if line.startswith("event: response.output_text.delta"))
    deadline = time.monotonic() + 30
    while aborted() < before + 1:
        assert time.monotonic() < deadline, "the abandoned response was not aborted"
        time.sleep(0.05)
