"""`treeflash run-batch`: an OpenAI batch file answered through the server's routes, offline, in the input's
order; each answer the offline one, each line that is no request an error line, and a refused request its 4xx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import treeflash
from helpers import make_tiny_chat_target
from treeflash import LLM, SamplingParams

pytest.importorskip("httpx")
PROMPTS = ["name a tree", "a b c", "zz top", "the cat sat", "hello there", "one two", "go far", "x y z", "up and up",
           "more of it", "tea time", "last one"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_chat_target(tmp_path_factory.mktemp("batch") / "chars", max_position_embeddings=256)


def run_batch(model_dir: Path, lines: list[str], *args: str) -> subprocess.CompletedProcess:
    root = str(Path(treeflash.__file__).resolve().parents[1])
    return subprocess.run([sys.executable, "-m", "treeflash.cli", "run-batch", "-i", "-", "-o", "-", "--model",
                           str(model_dir), "--device", "cpu", "--served-model-name", "tiny", *args],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"})


def line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_every_line_is_answered_in_order_as_offline_and_the_rest_say_why_not(model_dir):
    offline = LLM(str(model_dir), device="cpu", max_num_seqs=4)
    greedy = SamplingParams(temperature=0, max_tokens=10)
    lines = [line(f"c{i}", "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 10, "temperature": 0})
             for i, p in enumerate(PROMPTS)]
    lines += [line("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "name a tree"}],
                                                    "max_tokens": 10, "temperature": 0}),
              line("resp", "/v1/responses", {"input": "name a tree", "max_output_tokens": 10, "temperature": 0}),
              line("empty", "/v1/chat/completions", {"messages": [], "max_tokens": 4}),
              line("model", "/v1/completions", {"model": "other", "prompt": "a"}),
              line("stream", "/v1/completions", {"prompt": "a", "stream": True}),
              "not json", "", json.dumps({"custom_id": "get", "method": "GET", "url": "/v1/models"})]
    done = run_batch(model_dir, lines, "--max-num-seqs", "4")
    assert done.returncode == 0, done.stderr
    out = [json.loads(x) for x in done.stdout.splitlines()]
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(len(PROMPTS))] + [
        "chat", "resp", "empty", "model", "stream", None, "get"]  # (the blank line is no line)

    want = [o.text for o in offline.generate(PROMPTS, greedy)]
    assert [o["response"]["body"]["choices"][0]["text"] for o in out[:len(PROMPTS)]] == want
    chat = offline.chat([{"role": "user", "content": "name a tree"}], greedy)[0].text
    chat_out, resp_out = out[len(PROMPTS)], out[len(PROMPTS) + 1]
    assert chat_out["response"]["body"]["choices"][0]["message"]["content"] == chat
    assert resp_out["response"]["body"]["output"][0]["content"][0]["text"] == chat
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out[:len(PROMPTS) + 2])

    empty, model, stream, bad, get = out[len(PROMPTS) + 2:]
    assert (empty["response"]["status_code"], empty["response"]["body"]["error"]["param"]) == (400, "messages")
    assert (model["response"]["status_code"], model["response"]["body"]["error"]["param"]) == (404, "model")
    for o in (stream, bad, get):
        assert o["response"] is None and o["error"]["message"] and o["id"].startswith("batch_req_")
    assert "stream is not available" in stream["error"]["message"] and bad["error"]["code"] == "invalid_json"
    assert f"{len(lines) - 1} lines: {len(PROMPTS) + 2} answered, 2 refused" in done.stderr


def test_a_missing_input_file_is_one_error_line(model_dir, tmp_path):
    root = str(Path(treeflash.__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-m", "treeflash.cli", "run-batch", "-i", str(tmp_path / "absent.jsonl"),
                           "-o", str(tmp_path / "out.jsonl"), "--model", str(model_dir), "--device", "cpu"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 1 and done.stderr.startswith("treeflash: error:") and "absent.jsonl" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_the_input_is_read_as_the_answers_go_out(model_dir):
    """A long input is not read whole: when the first answer is written, at most twice the concurrency of lines
    have been read (the rest are read as answers leave), and every line is still answered, in order."""
    import asyncio

    from treeflash.server import ServerConfig
    from treeflash.server.app import build_app
    from treeflash.server.batch import run_batch as answer_lines

    llm = LLM(str(model_dir), device="cpu", max_num_seqs=2)
    app = build_app(llm, ServerConfig(model_name="tiny"))
    read, written = [], []

    def lines():
        for i in range(40):
            read.append(i)
            yield line(f"r{i}", "/v1/completions", {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)],
                                                    "max_tokens": 3, "temperature": 0})
            if i % 7 == 0:
                yield "\n"  # blank lines are skipped

    def write(text: str) -> None:
        written.append((len(read), json.loads(text)["custom_id"]))

    counts = asyncio.run(answer_lines(app, lines(), write, concurrency=3))
    assert counts.lines == counts.succeeded == 40
    assert [custom_id for _, custom_id in written] == [f"r{i}" for i in range(40)]
    assert written[0][0] <= 2 * 3 + 1 and written[20][0] <= 20 + 2 * 3 + 1
