"""`treeflash serve`: a real server in a subprocess on a free loopback port, driven by the real `openai` client.

One server per module (a tiny random model with a character tokenizer and a chat template); a second
one with a random DFlash drafter (ddtree) checks that speculative greedy output through HTTP equals
plain decoding, and ends with SIGTERM while a stream is in flight.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import CHAT_TEMPLATE, CHARS, make_tiny_chat_target
from server_helpers import Server
from spec_helpers import make_drafter
from treeflash import LLM, SamplingParams

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

KEY = "test-key"
NAME = "tiny"
CONTEXT = 4096  # long enough that a request can still be running when its client leaves
TEMPLATE = CHAT_TEMPLATE
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a tree"}]
TOOL = {"type": "function", "function": {"name": "now", "description": "the time", "parameters": {"type": "object"}}}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "now", "arguments": "{}"}}]}


# --- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_chat_target(tmp_path_factory.mktemp("server") / "chars", max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def server(model_dir):
    srv = Server(str(model_dir), "--max-num-seqs", "4", "--api-key", KEY, "--served-model-name", NAME,
                 "--structure-compile-timeout", "3")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_slow_compile_holds_up_no_other_request(server, client):
    """Structures compile on a thread of their own: a plain request sent while one compiles (here a pattern
    whose automaton explodes, stopped at the server's 3 s limit) is answered first."""
    done = []

    def slow():
        answer = httpx.post(server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                            json={"model": NAME, "prompt": "ab", "max_tokens": 4, "guided_regex": "(a|b)*a(a|b){22}"})
        done.append(("slow", answer.status_code, answer.json()["error"]["param"]))

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(slow)
        time.sleep(1.0)  # (it is compiling by now: validating a 2-token prompt takes milliseconds)
        client.completions.create(model=NAME, prompt="ab", max_tokens=4)
        done.append(("plain",))
        pending.result()
    assert done == [("plain",), ("slow", 400, "guided_regex")]


@pytest.fixture(scope="module")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), device="cpu", max_num_seqs=8)


def metric(server: Server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


# --- the endpoints --------------------------------------------------------------------------------
def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(server.url + "/health").status_code == 200
    text = httpx.get(server.url + "/metrics").text
    for name in ("treeflash_requests_running", "treeflash_requests_waiting", "treeflash_requests_finished_total",
                 "treeflash_prompt_tokens_total", "treeflash_generation_tokens_total",
                 "treeflash_acceptance_length_bucket", "treeflash_batch_size_bucket",
                 "treeflash_time_to_first_token_seconds_bucket", "treeflash_inter_token_latency_seconds_bucket"):
        assert name in text


def test_completion_greedy_equals_offline_generate(client, offline):
    want = offline.generate("the tree", greedy(ignore_eos=True))[0]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=24, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == "length"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(want.prompt_token_ids), 24)


def test_streamed_completion_equals_offline_and_ends_with_usage(client, offline):
    want = offline.generate("a forest", greedy(40))[0]
    chunks = list(client.completions.create(model=NAME, prompt="a forest", max_tokens=40, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_token_id_prompt(client, offline):
    ids = [5, 9, 13, 2, 40]
    want = offline.generate(prompt_token_ids=[ids], sampling_params=greedy(16))[0]
    got = client.completions.create(model=NAME, prompt=ids, max_tokens=16, temperature=0)
    assert got.choices[0].text == want.text and got.usage.prompt_tokens == len(ids)


def test_chat_streamed_and_not_equal_offline_chat(client, offline):
    want = offline.chat(CHAT, greedy(30))[0]
    got = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=30, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    assert got.choices[0].finish_reason == want.finish_reason
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    chunks = list(client.chat.completions.create(model=NAME, messages=CHAT, max_completion_tokens=30, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_an_empty_message_content_is_taken_as_openai_takes_it(client, offline):
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "name a tree"}]
    want = offline.chat(messages, greedy(8))[0]
    got = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    assert got.choices[0].message.content == want.text and got.usage.prompt_tokens == len(want.prompt_token_ids)


def test_seeded_samples_equal_offline_ones_choice_by_choice(client, offline):
    sampling = dict(temperature=0.9, top_p=0.95, max_tokens=30)
    extra = {"top_k": 20, "min_p": 0.02}
    want = offline.generate(["oak"] * 3, [SamplingParams(**sampling, **extra, seed=1234 + j) for j in range(3)])
    got = client.completions.create(model=NAME, prompt="oak", n=3, seed=1234, extra_body=extra, **sampling)
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == [w.text for w in want]
    assert len({w.text for w in want}) > 1  # the choices are different samples
    assert got.usage.prompt_tokens == len(want[0].prompt_token_ids)  # the prompt counts once


def test_completion_log_probs_equal_offline_ones_streamed_or_not(client, offline):
    want = offline.generate("the tree", greedy(12, ignore_eos=True, logprobs=2))[0]
    ours = [(e[t].logprob, sorted(lp.logprob for i, lp in e.items() if i != t or lp.rank <= 2)[::-1])
            for t, e in zip(want.token_ids, want.logprobs)]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=12, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True}).choices[0].logprobs
    chunks = list(client.completions.create(model=NAME, prompt="the tree", max_tokens=12, temperature=0, logprobs=2,
                                            stream=True, extra_body={"ignore_eos": True}))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    for lists in (got, streamed):
        if isinstance(lists, list):  # the stream's pieces, joined
            lists = type(got)(**{k: sum((getattr(x, k) for x in lists), []) for k in
                                 ("tokens", "token_logprobs", "top_logprobs", "text_offset")})
        assert "".join(lists.tokens) == want.text  # (a character tokenizer: one character a token)
        assert lists.text_offset == list(range(12))
        assert [round(x, 5) for x in lists.token_logprobs] == [round(lp, 5) for lp, _ in ours]
        for top, (_, best) in zip(lists.top_logprobs, ours):
            assert sorted(top.values(), reverse=True) == pytest.approx(best, abs=1e-5)


def test_chat_log_probs_with_top_alternatives_and_their_bytes(client, offline):
    want = offline.chat(CHAT, greedy(10, logprobs=3))[0]
    answer = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0, logprobs=True,
                                            top_logprobs=3)
    reply, content = answer.choices[0], answer.choices[0].logprobs.content
    # Every generated token has its entry, the stop token too (as usage counts it), which the text leaves out.
    assert len(content) == answer.usage.completion_tokens == len(want.token_ids)
    assert "".join(c.token for c in content).startswith(reply.message.content) and reply.message.content == want.text
    for c, token, entry in zip(content, want.token_ids, want.logprobs):
        assert c.logprob == pytest.approx(entry[token].logprob, abs=1e-5) and c.bytes == list(c.token.encode())
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob >= c.top_logprobs[-1].logprob
        assert c.logprob <= c.top_logprobs[0].logprob + 1e-6
    # Streamed, the chunks' entries join into the same list; without logprobs there are none.
    chunks = list(client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0,
                                                 logprobs=True, top_logprobs=3, stream=True))
    joined = [c for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
              for c in chunk.choices[0].logprobs.content]
    assert [(c.token, round(c.logprob, 5)) for c in joined] == [(c.token, round(c.logprob, 5)) for c in content]
    plain = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_echo_puts_the_prompt_and_its_log_probs_first_streamed_or_not(client, offline):
    """Completions' echo: the text starts with the prompt, and with logprobs the lists start with the prompt's
    tokens (the first without a log-prob, as OpenAI's), each the target's log-prob of it (an evaluation
    harness's loglikelihood request: token ids, echo, one new token, logprobs 1)."""
    want = offline.generate("the tree", greedy(6, ignore_eos=True, logprobs=1, prompt_logprobs=1))[0]
    prompt = want.prompt_token_ids
    expected = [None] + [e[t].logprob for t, e in zip(prompt[1:], want.prompt_logprobs[1:])] + [
        e[t].logprob for t, e in zip(want.token_ids, want.logprobs)]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=6, temperature=0, echo=True,
                                    logprobs=1, extra_body={"ignore_eos": True}).choices[0]
    assert got.text == "the tree" + want.text
    lists = got.logprobs
    assert "".join(lists.tokens) == got.text and lists.text_offset == list(range(len(got.text)))
    assert lists.top_logprobs[0] is None and all(len(t) in (1, 2) for t in lists.top_logprobs[1:])
    assert [x if x is None else round(x, 5) for x in lists.token_logprobs] == [
        x if x is None else round(x, 5) for x in expected]
    chunks = list(client.completions.create(model=NAME, prompt="the tree", max_tokens=6, temperature=0, echo=True,
                                            logprobs=1, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == got.text
    assert [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.tokens] \
        == lists.tokens
    # Token ids in, echo without log-probs: the decoded prompt; one new token, as harnesses ask.
    ids = client.completions.create(model=NAME, prompt=prompt, max_tokens=1, temperature=0, echo=True).choices[0]
    assert ids.text == "the tree" + want.text[:1] and ids.logprobs is None


def test_prompt_logprobs_as_vllm_gives_them_on_both_endpoints(client, offline):
    want = offline.generate("the tree", greedy(3, ignore_eos=True, prompt_logprobs=2))[0]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=3, temperature=0,
                                    extra_body={"ignore_eos": True, "prompt_logprobs": 2}).choices[0]
    entries = got.model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(want.prompt_token_ids)
    for entry, ref in zip(entries[1:], want.prompt_logprobs[1:]):
        assert {int(k) for k in entry} == set(ref)
        for k, v in entry.items():
            assert v["logprob"] == pytest.approx(ref[int(k)].logprob, abs=1e-5) and v["rank"] == ref[int(k)].rank
            assert v["decoded_token"] == ref[int(k)].decoded_token
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=2, temperature=0,
                                          extra_body={"prompt_logprobs": 0})
    offline_chat = offline.chat(CHAT, greedy(2, prompt_logprobs=0))[0]
    entries = chat.model_extra["prompt_logprobs"]
    assert len(entries) == len(offline_chat.prompt_token_ids) and all(len(e) == 1 for e in entries[1:])
    assert [round(next(iter(e.values()))["logprob"], 5) for e in entries[1:]] == [
        round(e[t].logprob, 5) for t, e in zip(offline_chat.prompt_token_ids[1:], offline_chat.prompt_logprobs[1:])]
    plain = client.completions.create(model=NAME, prompt="the tree", max_tokens=2, temperature=0).choices[0]
    assert plain.model_extra.get("prompt_logprobs") is None


def test_penalties_give_the_offline_tokens(client, offline):
    penalties = {"presence_penalty": 1.0, "frequency_penalty": 0.5, "repetition_penalty": 1.3}
    want = offline.generate("the tree", greedy(24, ignore_eos=True, **penalties))[0]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=24, temperature=0,
                                    presence_penalty=1.0, frequency_penalty=0.5,
                                    extra_body={"ignore_eos": True, "repetition_penalty": 1.3})
    assert got.choices[0].text == want.text
    assert want.text != offline.generate("the tree", greedy(24, ignore_eos=True))[0].text


def test_min_tokens_gives_the_offline_tokens(client, offline):
    want = offline.generate("the tree", greedy(24, min_tokens=20))[0]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=24, temperature=0,
                                    extra_body={"min_tokens": 20})
    assert got.choices[0].text == want.text and got.usage.completion_tokens == len(want.token_ids) >= 20


def test_allowed_token_ids_give_the_offline_tokens(client, offline):
    allowed = [offline.encode(c)[0] for c in "abcde "]
    want = offline.generate("the tree", greedy(12, ignore_eos=True, allowed_token_ids=allowed))[0]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True, "allowed_token_ids": allowed}).choices[0]
    assert got.text == want.text and set(got.text) <= set("abcde ")


def test_truncate_prompt_tokens_keeps_the_prompts_tail(client, offline):
    want = offline.generate("the tree", greedy(5, ignore_eos=True))[0]
    got = client.completions.create(model=NAME, prompt="a long way to the tree", max_tokens=5, temperature=0,
                                    echo=True, extra_body={"ignore_eos": True, "truncate_prompt_tokens": 8})
    assert got.choices[0].text == "the tree" + want.text and got.usage.prompt_tokens == 8
    over = client.completions.create(model=NAME, prompt=LONG, max_tokens=1, temperature=0,
                                     extra_body={"truncate_prompt_tokens": -1})
    assert over.usage.prompt_tokens == CONTEXT - 1 and over.usage.completion_tokens == 1


def test_bad_words_give_the_offline_tokens(client, offline):
    free = offline.generate("the tree", greedy(12, ignore_eos=True))[0].text
    words = [free[2:4], free[6]]
    want = offline.generate("the tree", greedy(12, ignore_eos=True, bad_words=words))[0]
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True, "bad_words": words}).choices[0]
    assert got.text == want.text != free and not any(w in got.text for w in words)


def test_logit_bias_steers_the_answer(client):
    a = 1 + CHARS.index("a")  # the character tokenizer's id of "a" (0 is its end-of-sequence token)
    got = client.completions.create(model=NAME, prompt="the tree", max_tokens=8, temperature=0,
                                    logit_bias={str(a): 100}, extra_body={"ignore_eos": True})
    assert got.choices[0].text == "a" * 8


def test_stop_string_cuts_the_text_streamed_or_not(client, offline):
    free = offline.generate("pine", greedy(60, ignore_eos=True))[0].text
    stop = free[25:28]
    want = free[:free.index(stop)]
    body = dict(model=NAME, prompt="pine", max_tokens=60, temperature=0, stop=["QQQQ", stop],
                extra_body={"ignore_eos": True})
    got = client.completions.create(**body)
    assert (got.choices[0].text, got.choices[0].finish_reason) == (want, "stop")
    streamed = list(client.completions.create(**body, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == want
    # vLLM's stop_reason names the stop string; include_stop_str_in_output keeps it in the text
    assert got.choices[0].model_extra["stop_reason"] == stop == streamed[-1].choices[0].model_extra["stop_reason"]
    kept = client.completions.create(**{**body, "extra_body": {"ignore_eos": True, "include_stop_str_in_output": True}})
    assert kept.choices[0].text == want + stop
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=5, temperature=0)
    assert chat.choices[0].model_extra["stop_reason"] is None


def test_32_concurrent_requests_with_mixed_sampling_all_complete_correctly(client, offline):
    """More requests than slots (4): a waiting queue, greedy and seeded requests side by side, streamed
    and not; every answer is its own offline output (nothing lost, nothing mixed up)."""
    jobs = []
    for i in range(32):
        prompt = f"tree number {i}"
        if i % 3 == 0:
            params = dict(temperature=0, max_tokens=20 + i)
        else:
            params = dict(temperature=0.7 + 0.01 * i, top_p=0.9, max_tokens=20 + i, seed=100 + i)
        jobs.append((prompt, params, i % 2 == 0))
    want = offline.generate([j[0] for j in jobs], [SamplingParams(**j[1]) for j in jobs])

    def run(job):
        prompt, params, stream = job
        if stream:
            chunks = client.completions.create(model=NAME, prompt=prompt, stream=True, **params)
            return "".join(c.choices[0].text for c in chunks)
        return client.completions.create(model=NAME, prompt=prompt, **params).choices[0].text

    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(run, jobs))
    assert got == [w.text for w in want]


# --- bad input and auth ---------------------------------------------------------------------------
LONG = "a" * (CONTEXT + 10)
BAD = [  # (route, body, status, param)
    ("completions", b"{not json", 400, None),
    ("completions", b"[1, 2]", 400, None),
    ("completions", {"model": NAME, "max_tokens": 5}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": 7}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ("completions", {"model": NAME, "prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("completions", {"model": NAME, "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("completions", {"model": NAME, "prompt": "x", "top_k": -3}, 400, "top_k"),
    ("completions", {"model": NAME, "prompt": "x", "min_p": 2}, 400, "min_p"),
    ("completions", {"model": NAME, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"model": NAME, "prompt": "x", "stop": ""}, 400, "stop"),
    ("completions", {"model": NAME, "prompt": "x", "seed": 1.5}, 400, "seed"),
    ("completions", {"model": NAME, "prompt": "x", "n": 0}, 400, "n"),
    ("completions", {"model": NAME, "prompt": "x", "n": 1000}, 400, "n"),
    ("completions", {"model": NAME, "prompt": LONG}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": "x", "max_tokens": CONTEXT}, 400, "max_tokens"),
    ("completions", {"model": NAME, "prompt": [1, 2, 999]}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": ""}, 400, "prompt"),
    ("completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("completions", {"model": NAME, "prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("completions", {"model": NAME, "prompt": "x", "logprobs": True}, 400, "logprobs"),
    ("completions", {"model": NAME, "prompt": "x", "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("chat/completions", {"model": NAME, "messages": []}, 400, "messages"),
    ("chat/completions", {"model": NAME}, 400, "messages"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user"}]}, 400, "messages[0]"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    # Each of these was a 500 with a plain-text body: a seed + j past 2**64, JSON nested past Python's
    # recursion limit, a lone surrogate (valid JSON) that the tokenizer raises TypeError on.
    ("completions", {"model": NAME, "prompt": "x", "seed": (1 << 64) - 1, "n": 2}, 400, "seed"),
    ("completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ("completions", b'{"model": "tiny", "prompt": "\\ud800", "max_tokens": 2}', 400, "prompt"),
    ("completions", {"model": NAME, "prompt": "x", "seed": -1}, 400, "seed"),
    # Fields that change the output and were ignored: refused by name.
    ("chat/completions", {"model": NAME, "messages": CHAT, "logprobs": 3}, 400, "logprobs"),
    ("completions", {"model": NAME, "prompt": "x", "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    ("completions", {"model": NAME, "prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("completions", {"model": NAME, "prompt": "x", "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("completions", {"model": NAME, "prompt": "x", "bad_words": ["a" * 17]}, 400, "bad_words"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "bad_words": [""]}, 400, "bad_words"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "allowed_token_ids": [1, 99999]}, 400, "allowed_token_ids"),
    ("completions", {"model": NAME, "prompt": "x", "min_tokens": -1}, 400, "min_tokens"),
    ("completions", {"model": NAME, "prompt": "x", "min_tokens": 9, "max_tokens": 4}, 400, "min_tokens"),
    ("completions", {"model": NAME, "prompt": "x", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "truncate_prompt_tokens": -3}, 400,
     "truncate_prompt_tokens"),
    ("completions", {"model": NAME, "prompt": "x", "include_stop_str_in_output": "yes"}, 400,
     "include_stop_str_in_output"),
    ("completions", {"model": NAME, "prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("completions", {"model": NAME, "prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "frequency_penalty": "1"}, 400, "frequency_penalty"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "logit_bias": {"five": 1.0}}, 400, "logit_bias"),
    ("completions", {"model": NAME, "prompt": "x", "logit_bias": {"99999": 1.0}}, 400, "logit_bias"),
    ("completions", {"model": NAME, "prompt": "x", "guided_grammar": "root ::= x"}, 400, "guided_grammar"),
    ("completions", {"model": NAME, "prompt": "x", "guided_choice": []}, 400, "guided_choice"),
    ("completions", {"model": NAME, "prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}, 400,
     "guided_choice"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "structured_outputs": {"regex": "(a"}}, 400,
     "structured_outputs"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}, 400,
     "response_format"),  # (this vocabulary cannot spell "{")
    ("chat/completions", {"model": NAME, "messages": CHAT, "response_format": {"type": "xml"}}, 400,
     "response_format"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "response_format": {"type": "json_schema"}}, 400,
     "response_format"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "guided_regex": "a+", "min_tokens": 2}, 400,
     "guided_regex"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "functions": [{"name": "f", "parameters": {}}]}, 400,
     "functions"),
    # How vLLM builds the prompt: what this server cannot do, or a combination that makes no prompt.
    ("chat/completions", {"model": NAME, "messages": CHAT, "continue_final_message": True}, 400,
     "continue_final_message"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "continue_final_message": True,
                          "add_generation_prompt": False}, 400, "continue_final_message"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "chat_template_kwargs": {"tokenize": True}}, 400,
     "chat_template_kwargs"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "chat_template_kwargs": ["x"]}, 400,
     "chat_template_kwargs"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "documents": [{"title": "a", "text": "b"}]}, 400,
     "documents"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "chat_template": "{{ 'x' }}"}, 400, "chat_template"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "echo": True}, 400, "echo"),
    # (SmolLM2's template reads no reasoning_effort: tests/test_server.py's GPT-OSS-like one below does)
    ("chat/completions", {"model": NAME, "messages": CHAT, "reasoning_effort": "low"}, 400, "reasoning_effort"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "reasoning_effort": "extreme"}, 400, "reasoning_effort"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "add_special_tokens": True}, 400, "add_special_tokens"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "skip_special_tokens": "no"}, 400, "skip_special_tokens"),
    ("completions", {"model": NAME, "prompt": "x", "add_special_tokens": False}, 400, "add_special_tokens"),
    ("completions", {"model": NAME, "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}, 400,
     "response_format"),  # (this vocabulary cannot spell "{")
    ("completions", {"model": NAME, "prompt": "x", "guided_whitespace_pattern": " "}, 400,
     "guided_whitespace_pattern"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "assistant", "content": None}]}, 400, "messages[0]"),
    # Tools: this model's template does not show them (nor render calls); forcing a call needs guided decoding.
    ("chat/completions", {"model": NAME, "messages": CHAT, "tools": [TOOL]}, 400, "tools"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "tools": [TOOL],
                          "tool_choice": {"type": "function", "function": {"name": "now"}}}, 400, "tools"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "tools": [TOOL],
                          "tool_choice": {"type": "function", "function": {"name": "later"}}}, 400, "tool_choice"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "tools": [{"type": "retrieval"}]}, 400, "tools[0].type"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "tools": [{"type": "function", "function": {
        "name": "two words"}}]}, 400, "tools[0].function.name"),
    ("chat/completions", {"model": NAME, "messages": CHAT + [CALL], "tools": [TOOL]}, 400, "messages"),
    ("chat/completions", {"model": NAME, "messages": CHAT + [{**CALL, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{'tz': 1}"}}]}]}, 400,
     "messages[2].tool_calls[0].function.arguments"),
    ("chat/completions", {"model": NAME, "messages": [{**CHAT[1], "tool_calls": CALL["tool_calls"]}]}, 400,
     "messages[0]"),
    ("completions", {"model": NAME, "prompt": "x", "tools": [TOOL]}, 400, "tools"),
    ("completions", {"model": NAME, "prompt": "x", "tool_choice": "required"}, 400, "tool_choice"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
]


@pytest.mark.parametrize("route, body, status, param", BAD, ids=[f"{r}-{i}" for i, (r, *_) in enumerate(BAD)])
def test_bad_input_gets_its_4xx_and_the_server_keeps_serving(server, client, route, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = httpx.post(f"{server.url}/v1/{route}", content=content,
                        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    ok = client.completions.create(model=NAME, prompt="still", max_tokens=3, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_a_body_over_the_cap_is_refused_unread_declared_or_chunked(server, client):
    big = b'{"model": "tiny", "prompt": "' + b"a" * (16 << 20) + b'"}'  # the default cap is 16 MiB

    def chunks():  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]

    for content in (big, chunks()):
        answer = httpx.post(f"{server.url}/v1/completions", content=content, timeout=60,
                            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["code"] == "request_too_large"
    ok = client.completions.create(model=NAME, prompt="still", max_tokens=3, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_api_key_is_required_on_v1_only(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        answer = httpx.get(server.url + "/v1/models", headers=headers)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(server.url + "/health").status_code == 200  # health and metrics stay open
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_neutral_values_of_unsupported_fields_and_max_completion_tokens_are_honoured(server, client, offline):
    neutral = {"min_tokens": 0, "include_stop_str_in_output": False, "repetition_penalty": 1.0, "logprobs": None,
               "tool_choice": "none", "truncate_prompt_tokens": None, "some_unknown_field": 3,
               "presence_penalty": 0.0, "frequency_penalty": 0, "logit_bias": {}}
    got = client.completions.create(model=NAME, prompt="ab", max_tokens=2, temperature=0,
                                    extra_body={**neutral, "max_completion_tokens": 5, "ignore_eos": True})
    # max_completion_tokens (OpenAI's newer name) counts on /v1/completions too, before max_tokens.
    want = offline.generate("ab", greedy(5, ignore_eos=True))[0]
    assert got.usage.completion_tokens == 5 and got.choices[0].text == want.text


def test_fields_a_request_leaves_out_take_the_models_generation_config(model_dir, offline, tmp_path):
    """vLLM's --generation-config: the model's temperature, top_k and max_new_tokens (greedy, 5, 6 here) where a
    request does not say; what it says stands; the server says at start-up that they apply."""
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0, "top_k": 5, "max_new_tokens": 6}))
    srv = Server(str(model_dir), "--generation-config", str(tmp_path), log_dir=tmp_path)
    try:
        local = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        want = offline.chat(CHAT, greedy(6, ignore_eos=True))[0]
        got = local.chat.completions.create(model=str(model_dir), messages=CHAT, extra_body={"ignore_eos": True})
        assert got.choices[0].message.content == want.text and got.usage.completion_tokens == 6
        got = local.completions.create(model=str(model_dir), prompt="ab", extra_body={"ignore_eos": True})
        assert got.usage.completion_tokens == 6  # (the completions endpoint's own default, 16, capped at 6)
        asked = [local.completions.create(model=str(model_dir), prompt="ab", max_tokens=12, temperature=1.0, seed=s,
                                          extra_body={"ignore_eos": True, "top_k": -1}) for s in (1, 2)]
        want = offline.generate(["ab"] * 2, [SamplingParams(temperature=1.0, seed=s, max_tokens=12, ignore_eos=True)
                                             for s in (1, 2)])
        assert [a.choices[0].text for a in asked] == [w.text for w in want]
        assert "the model's default sampling (temperature=0, top_k=5, max_tokens=6" in srv.output()
    finally:
        srv.stop()


def test_structured_fields_give_the_offline_structured_tokens(client, offline):
    choice = ["oak", "pine tree", "ash"]
    want = offline.generate("name a tree", greedy(8, structured_outputs={"choice": choice}))[0]
    got = client.completions.create(model=NAME, prompt="name a tree", max_tokens=8, temperature=0,
                                    extra_body={"guided_choice": choice})
    assert got.choices[0].text == want.text and want.text in choice and got.choices[0].finish_reason == "stop"
    regex = r"[a-z]{3,6}( [a-z]{2,5})?"
    want = offline.chat(CHAT, greedy(12, structured_outputs={"regex": regex}))[0]
    for extra in ({"guided_regex": regex}, {"structured_outputs": {"regex": regex}}):
        got = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12, temperature=0, extra_body=extra)
        assert got.choices[0].message.content == want.text and re.fullmatch(regex, want.text)
    streamed = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12, temperature=0, stream=True,
                                              extra_body={"guided_regex": regex})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want.text


def test_skip_special_tokens_false_keeps_them_in_the_text(client):
    forced = {"ignore_eos": True, "logit_bias": {"0": 100}}  # id 0: the special <eos>
    got = client.completions.create(model=NAME, prompt="ab", max_tokens=2, temperature=0,
                                    extra_body={**forced, "skip_special_tokens": False})
    assert got.choices[0].text == "<eos><eos>"
    streamed = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=2, temperature=0, stream=True,
                                              extra_body={**forced, "skip_special_tokens": False})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "<eos><eos>"


def test_tokenize_gives_the_ids_the_endpoints_run_and_detokenize_their_text(server, client, offline):
    auth = {"Authorization": f"Bearer {KEY}"}
    got = httpx.post(server.url + "/tokenize", headers=auth, json={"model": NAME, "prompt": "the tree"}).json()
    assert got == {"count": len(offline.encode("the tree")), "max_model_len": CONTEXT,
                   "tokens": offline.encode("the tree")}
    chat = httpx.post(server.url + "/tokenize", headers=auth, json={"messages": CHAT}).json()
    reply = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=1)
    assert chat["tokens"] == offline.chat_token_ids(CHAT) and chat["count"] == reply.usage.prompt_tokens
    cut = httpx.post(server.url + "/tokenize", headers=auth, json={"messages": CHAT, "add_generation_prompt": False})
    assert cut.json()["tokens"] == offline.chat_token_ids(CHAT, add_generation_prompt=False)
    text = httpx.post(server.url + "/detokenize", headers=auth, json={"model": NAME, "tokens": chat["tokens"]}).json()
    assert text == {"prompt": offline.tokenizer.decode(chat["tokens"])}
    for route, body, param in (("tokenize", {"prompt": "a", "messages": CHAT}, None),
                               ("tokenize", {}, None), ("detokenize", {"tokens": [1, 99999]}, "tokens"),
                               ("detokenize", {"tokens": "12"}, "tokens"), ("tokenize", {"prompt": "a", "model": "x"},
                                                                            "model")):
        answer = httpx.post(f"{server.url}/{route}", headers=auth, json=body)
        assert answer.status_code in (400, 404) and answer.json()["error"]["param"] == param, (route, body)
    assert httpx.post(server.url + "/tokenize", json={"prompt": "a"}).status_code == 401


def test_tool_choice_none_hides_the_tools_and_the_reply_is_text(client, offline):
    want = offline.chat(CHAT, greedy(8))[0]
    got = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, temperature=0, tools=[TOOL],
                                         tool_choice="none", parallel_tool_calls=False)
    assert got.choices[0].message.content == want.text and not got.choices[0].message.tool_calls
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)


def test_prompt_building_fields_give_the_offline_prompt_and_reply(client, offline):
    reply = CHAT + [{"role": "assistant", "content": "an oak"}]
    for messages, fields in ((CHAT, {"add_generation_prompt": False}),
                             (reply, {"add_generation_prompt": False, "continue_final_message": True}),
                             (CHAT, {"chat_template_kwargs": {"enable_thinking": False}})):
        want = offline.chat(messages, greedy(6, ignore_eos=True), **fields)[0]
        got = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0,
                                             extra_body={**fields, "ignore_eos": True})
        assert got.choices[0].message.content == want.text
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    # (the template writes "role content " per message: going on with the reply drops the turn's end)
    assert offline.tokenizer.decode(offline.chat_token_ids(reply, add_generation_prompt=False,
                                                           continue_final_message=True)).endswith("assistant an oak")


def test_chat_template_kwargs_and_documents_reach_the_template(offline):
    from treeflash.server.frontend import Frontend, ServerConfig
    from treeflash.server.protocol import ChatCompletionRequest

    frontend = Frontend(offline, ServerConfig(model_name=NAME))
    frontend.tokenizer.chat_template = ("{% if brief %}brief {% endif %}{% for d in documents or [] %}{{ d.text }} "
                                        "{% endfor %}" + TEMPLATE)
    body = {"messages": CHAT, "chat_template_kwargs": {"brief": True}, "documents": [{"title": "t", "text": "oaks"}]}
    (request,), _ = frontend.chat_requests(ChatCompletionRequest.model_validate(body))
    assert offline.tokenizer.decode(request.prompt_ids).startswith("brief oaks system be brief")
    # tools and documents together: both shown
    frontend.tokenizer.chat_template = "{% if tools %}tools {% endif %}" + frontend.tokenizer.chat_template + \
        " <tool_call></tool_call>"
    (request,), _ = frontend.chat_requests(ChatCompletionRequest.model_validate({**body, "tools": [TOOL]}))
    assert offline.tokenizer.decode(request.prompt_ids).startswith("tools brief oaks system be brief")


def test_tools_need_a_template_that_asks_for_calls_in_a_format_read_here(offline):
    from treeflash.server.errors import APIError
    from treeflash.server.frontend import Frontend, ServerConfig
    from treeflash.server.protocol import ChatCompletionRequest

    frontend = Frontend(offline, ServerConfig(model_name=NAME))
    body = ChatCompletionRequest.model_validate({"messages": CHAT, "tools": [TOOL]})
    shown = TEMPLATE + "{% if tools %}functions: {{ tools | tojson }}{% endif %}"
    frontend.tokenizer.chat_template = shown
    with pytest.raises(APIError, match="--tool-call-parser") as refused:  # shown, but calls in which format?
        frontend.chat_requests(body)
    assert (refused.value.status, refused.value.param) == (400, "tools")
    frontend.tokenizer.chat_template = shown + " reply <tool_call><arg_key>p</arg_key></tool_call>"
    with pytest.raises(APIError, match="XML format"):  # (GLM's: not read here, so not taken)
        frontend.chat_requests(body)
    # Qwen3-Coder's XML: read with the request's tools' parameter types; a forced call in its layout
    frontend.tokenizer.chat_template = shown + " reply <tool_call>\n<function=name>\n<parameter=p>"
    (request,), reader = frontend.chat_requests(body)
    assert reader().tools.format.name == "qwen3_coder"
    assert reader().tools.format.schemas == {"now": {}}  # (its parameters name no properties)
    forced = ChatCompletionRequest.model_validate({"messages": CHAT, "tools": [TOOL], "tool_choice": "required"})
    (request,), _ = frontend.chat_requests(forced)
    assert "<function=now>" in request.params.structured_outputs.regex
    frontend.tokenizer.chat_template = shown + " reply with <tool_call>{json}</tool_call>"
    (request,), reader = frontend.chat_requests(body)
    assert "assistant functions" in offline.tokenizer.decode(request.prompt_ids) and reader().tools.parallel
    assert reader().tools.format.name == "hermes" and request.params.skip_special_tokens
    with pytest.raises(ValueError, match="does not show tools"):
        offline.chat(CHAT, greedy(2), tools=[TOOL])
    # --tool-call-parser names the format where the template does not say it
    named = Frontend(offline, ServerConfig(model_name=NAME, tool_call_parser="llama3_json"))
    named.tokenizer.chat_template = shown
    (request,), reader = named.chat_requests(body)
    assert reader().tools.format.name == "llama3_json"
    with pytest.raises(ValueError, match="tool_call_parser must be one of hermes, qwen3_coder, llama3_json, mistral"):
        Frontend(offline, ServerConfig(model_name=NAME, tool_call_parser="pythonic"))


def test_mistral_format_keeps_special_tokens_and_forces_a_bare_list(offline):
    from treeflash.server.frontend import Frontend, ServerConfig
    from treeflash.server.protocol import ChatCompletionRequest

    frontend = Frontend(offline, ServerConfig(model_name=NAME))
    frontend.tokenizer.chat_template = TEMPLATE + "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}" \
        "[/AVAILABLE_TOOLS] calls: [TOOL_CALLS]{% endif %}"
    (request,), reader = frontend.chat_requests(ChatCompletionRequest.model_validate({"messages": CHAT,
                                                                                      "tools": [TOOL]}))
    # [TOOL_CALLS] is a special token in Mistral's vocabularies: the text must keep it to be read
    assert reader().tools.format.name == "mistral" and not request.params.skip_special_tokens
    (request,), _ = frontend.chat_requests(ChatCompletionRequest.model_validate({"messages": CHAT}))
    assert request.params.skip_special_tokens  # (no tools: as asked)
    # forced: the JSON list alone (no structure writes [TOOL_CALLS]), read back by the forced reader
    (request,), reader = frontend.chat_requests(ChatCompletionRequest.model_validate(
        {"messages": CHAT, "tools": [TOOL], "tool_choice": "required"}))
    assert request.params.structured_outputs.regex.startswith(r"\[")
    stream = reader().tools
    assert stream.feed('[{"name": "now", "arguments": {}}]') == ("", [])
    assert [c.name for c in stream.finish()[1]] == ["now"]


def test_a_chat_template_given_replaces_the_models(model_dir, tmp_path):
    template = "{% for m in messages %}{{ m.role }} said {{ m.content }} {% endfor %}{% if tools %}t{% endif %}"
    (tmp_path / "t.jinja").write_text(template)
    for given in (template, tmp_path / "t.jinja", str(tmp_path / "t.jinja")):
        llm = LLM(str(model_dir), device="cpu", max_num_seqs=1, chat_template=given)
        assert llm.tokenizer.decode(llm.chat_token_ids(CHAT, add_generation_prompt=False)) == \
            "system said be brief user said name a tree "
        from treeflash.server.frontend import Frontend, ServerConfig

        assert Frontend(llm, ServerConfig(model_name=NAME)).tokenizer.chat_template == template
    # one call's template (vLLM's LLM.chat(chat_template=...)), the LLM's own for the others
    upper = "{% for m in messages %}{{ m.content }} {% endfor %}"
    got = llm.chat(CHAT, greedy(2), chat_template=upper, add_generation_prompt=False)[0]
    assert llm.tokenizer.decode(got.prompt_token_ids) == "be brief name a tree "
    assert llm.tokenizer.decode(llm.chat_token_ids(CHAT, add_generation_prompt=False)).startswith("system said")
    with pytest.raises(ValueError, match="not a Jinja template"):
        llm.chat(CHAT, greedy(2), chat_template="{% if %}")
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}")
    for given, error in ((tmp_path / "none.jinja", "neither a file nor a Jinja template"),
                         (tmp_path / "bad.jinja", r"bad.jinja: not a Jinja template \(line 1"),
                         ("{{ messages", "chat_template: not a Jinja template")):
        with pytest.raises(ValueError, match=error):
            LLM(str(model_dir), device="cpu", chat_template=given)


def test_neutral_prompt_building_fields_and_text_parts_on_lines_of_their_own(client, offline):
    # The values that are what this server does anyway pass; text parts are joined as vLLM joins them.
    messages = [{"role": "user", "content": [{"type": "text", "text": "name"}, {"type": "text", "text": "a tree"}]}]
    want = offline.chat([{"role": "user", "content": "name\na tree"}], greedy(8))[0]
    got = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0, extra_body={
        "add_generation_prompt": True, "continue_final_message": False, "chat_template_kwargs": {}, "echo": False,
        "add_special_tokens": False, "skip_special_tokens": True})
    assert got.choices[0].message.content == want.text and got.usage.prompt_tokens == len(want.prompt_token_ids)
    got = client.completions.create(model=NAME, prompt="ab", max_tokens=3, temperature=0, extra_body={
        "add_special_tokens": True, "response_format": {"type": "text"}, "spaces_between_special_tokens": True})
    assert got.choices[0].text == offline.generate("ab", greedy(3))[0].text


def test_one_model_by_name_and_a_lowercase_bearer_scheme(server, client):
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    answer = httpx.get(server.url + "/v1/models", headers={"Authorization": f"bearer {KEY}"})
    assert answer.status_code == 200  # the scheme is case-insensitive (RFC 7235)


def test_unknown_model_through_the_client(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=CHAT)


# --- disconnects ----------------------------------------------------------------------------------
def test_a_client_leaving_mid_stream_frees_its_slot_and_the_others_finish(server, client, offline):
    aborted = metric(server, 'treeflash_requests_finished_total{finish_reason="abort"}')
    others = [("elm", 300), ("ash", 320)]
    want = offline.generate([p for p, _ in others], [greedy(n, ignore_eos=True) for _, n in others])
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(lambda p, n: "".join(c.choices[0].text for c in client.completions.create(
            model=NAME, prompt=p, max_tokens=n, temperature=0, stream=True, extra_body={"ignore_eos": True})), p, n)
            for p, n in others]
        body = {"model": NAME, "prompt": "leaving", "max_tokens": CONTEXT - 100, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as answer:
            lines = answer.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
        # The connection is closed: the request is aborted (not run to its 3996 tokens) and its slot freed.
        deadline = time.monotonic() + 30
        while metric(server, 'treeflash_requests_finished_total{finish_reason="abort"}') < aborted + 1:
            assert time.monotonic() < deadline, "the abandoned request was not aborted"
            time.sleep(0.05)
        assert [f.result() for f in futures] == [w.text for w in want]
    deadline = time.monotonic() + 10
    while metric(server, "treeflash_requests_running") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_client_giving_up_on_a_non_streamed_request_aborts_it(server):
    aborted = metric(server, 'treeflash_requests_finished_total{finish_reason="abort"}')
    body = {"model": NAME, "prompt": "impatient", "max_tokens": CONTEXT - 100, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=0.5)
    deadline = time.monotonic() + 30
    while metric(server, 'treeflash_requests_finished_total{finish_reason="abort"}') < aborted + 1:
        assert time.monotonic() < deadline, "the abandoned request was not aborted"
        time.sleep(0.05)
    assert metric(server, "treeflash_requests_running") == 0


# --- speculative decoding through the server, and SIGTERM -----------------------------------------
@pytest.mark.slow  # a second server to start
def test_ddtree_server_gives_plain_greedy_text_and_exits_0_on_sigterm(model_dir, offline, tmp_path):
    drafter = make_drafter(tmp_path / "drafter", model_dir, block_size=4)
    # (--no-warmup: accepted; on the CPU nothing is captured either way)
    srv = Server(str(model_dir), "--draft-model", str(drafter), "--spec", "ddtree", "--tree-budget", "8",
                 "--max-num-seqs", "2", "--no-warmup")
    try:
        spec_client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        for prompt in ("the tree", "leaves fall"):
            want = offline.generate(prompt, greedy(50, ignore_eos=True))[0].text
            got = spec_client.completions.create(model=str(model_dir), prompt=prompt, max_tokens=50, temperature=0,
                                                 extra_body={"ignore_eos": True})
            assert got.choices[0].text == want
        assert metric(srv, "treeflash_acceptance_length_count") > 0
        want = offline.chat(CHAT, greedy(40))[0].text
        got = spec_client.chat.completions.create(model=str(model_dir), messages=CHAT, max_tokens=40, temperature=0)
        assert got.choices[0].message.content == want

        # SIGTERM with a stream in flight: no new connections, the stream still finishes, exit status 0.
        stream = spec_client.completions.create(model=str(model_dir), prompt="last", max_tokens=400, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True})
        first = next(iter(stream))
        srv.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):
            httpx.get(srv.url + "/health", timeout=2)
        rest = list(stream)
        assert rest[-1].choices[0].finish_reason == "length"
        text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
        assert text == offline.generate("last", greedy(400, ignore_eos=True))[0].text
    finally:
        code = srv.stop()
    assert code == 0, srv.output()


def test_the_load_script_finds_no_errors_and_no_mismatches(server, model_dir, tmp_path):
    """benchmarks/serve_load.py end to end at a tiny scale (its real run is on the embedded model)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import serve_load

    out = tmp_path / "load.json"
    report = serve_load.main(["--url", server.url, "--api-key", KEY, "--clients", "6", "--duration", "2",
                              "--model", str(model_dir), "--out", str(out)])
    assert json.loads(out.read_text())["summary"] == report["summary"]
    s = report["summary"]
    assert s["errors"] == 0 and report["mismatches"] == 0, (s["error_examples"], report["mismatch_examples"])
    assert s["requests_finished"] >= 6 and s["ttft_ms"]["n"] + s["empty_answers"] == s["requests_finished"]
    assert s["empty_answers"] < s["requests_finished"] // 2


def test_the_bad_input_script_gets_4xx_for_every_row(server):
    """benchmarks/serve_bad_inputs.py (the README's table) against the test server."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import serve_bad_inputs

    rows = serve_bad_inputs.main(["--url", server.url, "--api-key", KEY])
    assert len(rows) > 30
    for row in rows:
        assert 400 <= row["status"] < 500 and row["message"] and row["next_good_request"] == 200, row


def test_the_command_line_takes_a_chat_template(model_dir, tmp_path):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m.content }} {% endfor %}")

    def run(template: str):
        return subprocess.run([sys.executable, "-m", "treeflash.cli", "generate", "name a tree", "--chat",
                               "--model", str(model_dir), "--device", "cpu", "--max-tokens", "2", "--chat-template",
                               template], capture_output=True, text=True, timeout=300)

    ok = run(str(tmp_path / "t.jinja"))
    assert ok.returncode == 0, ok.stderr
    bad = run(str(tmp_path / "missing.jinja"))
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0
    assert "neither a file nor a Jinja template" in bad.stderr


def test_a_prompt_prefilled_before_is_reused_and_usage_says_how_much(server, client):
    prompt = ("the same long system prompt " * 25)[:600]  # 600 characters: one whole 512-token chunk
    cached_before = metric(server, "treeflash_prompt_tokens_cached_total")
    first = client.completions.create(model=NAME, prompt=prompt + "one", max_tokens=4, temperature=0)
    again = client.completions.create(model=NAME, prompt=prompt + "two", max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens == again.usage.prompt_tokens == 603
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 512
    assert metric(server, "treeflash_prompt_tokens_cached_total") == cached_before + 512
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=2, temperature=0)
    assert chat.usage.prompt_tokens_details.cached_tokens == 0  # (a short prompt: no whole chunk)


def test_the_harmony_parser_keeps_special_tokens_and_reads_the_channels(offline):
    """--reasoning-parser openai_gptoss: GPT-OSS's channel markers are special tokens, so its replies are
    written with them (whatever skip_special_tokens says) and read by channel (tests/test_reasoning.py)."""
    from treeflash.reasoning import HarmonyStream
    from treeflash.server.frontend import Frontend, ServerConfig
    from treeflash.server.protocol import ChatCompletionRequest

    frontend = Frontend(offline, ServerConfig(model_name=NAME, reasoning_parser="openai_gptoss"))
    (request,), reader = frontend.chat_requests(ChatCompletionRequest.model_validate({"messages": CHAT}))
    assert not request.params.skip_special_tokens and isinstance(reader().reasoning, HarmonyStream)
    got = reader()
    parts = [got.feed("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|mess"),
             got.feed("age|>Oaks."), got.finish()]
    assert "".join(p[0] for p in parts) == "Hm." and "".join(p[1] for p in parts) == "Oaks."
    plain = Frontend(offline, ServerConfig(model_name=NAME))
    (request,), reader = plain.chat_requests(ChatCompletionRequest.model_validate({"messages": CHAT}))
    assert request.params.skip_special_tokens and reader is None


def test_reasoning_effort_goes_to_a_template_that_reads_it(offline):
    """OpenAI's reasoning_effort (and the Responses API's reasoning.effort) reaches a chat template that reads
    it, GPT-OSS's "Reasoning: ..." line; set twice it must agree; a template that reads none refuses it (the
    endpoints' cases above)."""
    from treeflash.server.errors import APIError
    from treeflash.server.frontend import Frontend, ServerConfig
    from treeflash.server.protocol import ChatCompletionRequest, TokenizeRequest
    from treeflash.server.responses import ResponsesRequest, ResponseStore, to_chat

    frontend = Frontend(offline, ServerConfig(model_name=NAME, reasoning_parser="openai_gptoss"))
    frontend.tokenizer.chat_template = ("Reasoning {{ reasoning_effort | default('medium') }} "
                                        "{% for m in messages %}{{ m.content }}{% endfor %}")  # (its letters)

    def prompt(**fields) -> str:
        (request,), _ = frontend.chat_requests(ChatCompletionRequest.model_validate({"messages": CHAT, **fields}))
        return frontend.tokenizer.decode(request.prompt_ids)

    assert prompt().startswith("Reasoning medium ") and prompt(reasoning_effort="low").startswith("Reasoning low ")
    assert prompt(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "high"}).startswith(
        "Reasoning high ")
    with pytest.raises(APIError, match="differ") as e:
        prompt(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})
    assert e.value.param == "reasoning_effort"
    turn = to_chat(ResponsesRequest.model_validate({"input": "hi", "reasoning": {"effort": "low"}}), ResponseStore())
    assert turn.chat.reasoning_effort == "low"
    with pytest.raises(APIError, match="summaries") as e:
        to_chat(ResponsesRequest.model_validate({"input": "hi", "reasoning": {"summary": "auto"}}), ResponseStore())
    assert e.value.param == "reasoning"
    assert frontend.tokenize(TokenizeRequest.model_validate({"messages": CHAT}))


def test_an_earlier_replys_reasoning_goes_back_to_the_template(offline):
    """An assistant message's reasoning (vLLM's `reasoning` or `reasoning_content`, as this server returns it)
    reaches the template as Qwen3's `reasoning_content` and GPT-OSS's `thinking`, which show it again inside
    a tool loop; the Responses API's reasoning items and stored responses carry it the same way."""
    from pydantic import ValidationError

    from treeflash.server.frontend import Frontend, ServerConfig
    from treeflash.server.protocol import ChatCompletionRequest
    from treeflash.server.responses import ResponsesRequest, ResponseStore, ResponseWriter, to_chat

    frontend = Frontend(offline, ServerConfig(model_name=NAME))
    frontend.tokenizer.chat_template = ("{% for m in messages %}{{ m.content }}{% if m.reasoning_content is defined %}"
                                        " r {{ m.reasoning_content }} t {{ m.thinking }}{% endif %} {% endfor %}")
    said = [{"role": "user", "content": "name a tree"}, {"role": "assistant", "content": "oak", "reasoning": "hm"},
            {"role": "user", "content": "why"}]
    (request,), _ = frontend.chat_requests(ChatCompletionRequest.model_validate({"messages": said}))
    assert frontend.tokenizer.decode(request.prompt_ids) == "name a tree oak r hm t hm why "
    for bad in ({"role": "user", "content": "x", "reasoning": "y"},
                {"role": "assistant", "content": "x", "reasoning": "y", "reasoning_content": "z"}):
        with pytest.raises(ValidationError, match="reasoning"):
            ChatCompletionRequest.model_validate({"messages": [bad]})
    items = [{"role": "user", "content": "name a tree"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
             {"type": "function_call", "call_id": "c1", "name": "now", "arguments": "{}"},
             {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "s"}]},
             {"role": "assistant", "content": "oak"}]
    turn = to_chat(ResponsesRequest.model_validate({"input": items}), ResponseStore())
    assert [m.reasoning_content for m in turn.chat.messages] == [None, "hm", None]
    writer = ResponseWriter(turn, SamplingParams(), NAME, None)
    writer.output = [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "so"}]},
                     {"type": "message", "content": [{"type": "output_text", "text": "ash"}]}]
    assert writer.conversation()[-1] == {"role": "assistant", "content": "ash", "reasoning_content": "so"}


def test_harmony_tool_calls_are_read_with_the_harmony_parser_and_refused_without(offline):
    """A GPT-OSS chat template (it writes <|call|>) asks for the `openai` format: with --reasoning-parser
    openai_gptoss a reply's message to a function is a call (tests/test_tool_calls.py has the cases); without
    it the request is a 400 that names the flag, and so is forcing a call; the server refuses the explicit
    --tool-call-parser openai without the reasoning parser at start-up."""
    from treeflash.server.errors import APIError
    from treeflash.server.frontend import Frontend, ServerConfig
    from treeflash.server.protocol import ChatCompletionRequest

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    body = ChatCompletionRequest.model_validate({"messages": CHAT, "tools": tools})
    template = ("{% if tools %}namespace functions {{ tools | length }}{% endif %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}<|start|>assistant{# ...<|call|> #}")
    frontend = Frontend(offline, ServerConfig(model_name=NAME, reasoning_parser="openai_gptoss"))
    frontend.tokenizer.chat_template = template
    (request,), reader = frontend.chat_requests(body)
    got = reader()
    parts = [got.feed("<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary to=fun"),
             got.feed('ctions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'), got.finish()]
    assert [p[0] for p in parts] == ["Need it.", "", ""] and all(p[1] == "" for p in parts)
    assert [(c.name, c.arguments) for p in parts for c in p[2]] == [("get_weather", '{"city": "Oslo"}')]
    with pytest.raises(APIError, match="cannot force") as e:
        frontend.chat_requests(body.model_copy(update={"tool_choice": "required"}))
    assert e.value.status == 400 and e.value.param == "tool_choice"
    plain = Frontend(offline, ServerConfig(model_name=NAME))
    plain.tokenizer.chat_template = template
    with pytest.raises(APIError, match="--reasoning-parser openai_gptoss") as e:
        plain.chat_requests(body)
    assert e.value.status == 400 and e.value.param == "tools"
    with pytest.raises(ValueError, match="openai_gptoss"):
        Frontend(offline, ServerConfig(model_name=NAME, tool_call_parser="openai"))
