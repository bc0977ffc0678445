"""`treeflash serve` and `run-batch` on CUDA with the engine on the main thread (HTTP on a second one).

A tiny random float32 target (the tests' character tokenizer and chat template) and a random DFlash
drafter, DDTree at budget 8, CUDA graphs (the server's warm-up). Every answer through the server (chat,
completions, the Responses API streamed and not, 4 clients at once) and through `run-batch` is compared
with the same requests run offline through `LLM` on the same GPU and settings; then SIGTERM while a stream
is in flight: the stream must finish and the server exit 0.

    python benchmarks/gpu-serve-main-thread/check.py --out check.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PROMPTS = ["name a tree", "a b c", "zz top", "the cat sat", "hello there", "one two", "go far", "x y z"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script")
    args = parser.parse_args()

    import httpx

    from helpers import make_tiny_chat_target
    from spec_helpers import make_drafter
    from treeflash import LLM, SamplingParams

    folder = Path(tempfile.mkdtemp())
    target = make_tiny_chat_target(folder / "target", max_position_embeddings=512, logit_scale=3.0)
    drafter = make_drafter(folder / "drafter", target, block_size=4)
    options = dict(draft_model=str(drafter), spec="ddtree", tree_budget=8, device=args.device, dtype="float32",
                   max_num_seqs=4)
    n = args.max_tokens
    greedy = SamplingParams(temperature=0, max_tokens=n)
    offline = LLM(str(target), **options)
    want_completions = [o.text for o in offline.generate(PROMPTS, greedy, use_tqdm=False)]
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    want_chats = [o.text for o in offline.chat(chats, greedy, use_tqdm=False)]
    plain = LLM(str(target), spec="none", device=args.device, dtype="float32", max_num_seqs=4)
    plain_completions = [o.text for o in plain.generate(PROMPTS, greedy, use_tqdm=False)]
    del offline, plain
    result = {"command": " ".join(["python", "benchmarks/gpu-serve-main-thread/check.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "prompts": len(PROMPTS), "max_tokens": n,
              "ddtree_equal_plain_offline": sum(a == b for a, b in zip(want_completions, plain_completions))}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = open(folder / "server.log", "w+")
    start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "treeflash.cli", "serve", str(target), "--draft-model",
                               str(drafter), "--tree-budget", "8", "--device", args.device, "--dtype", "float32",
                               "--max-num-seqs", "4", "--port", str(port), "--log-level", "warning"],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        assert server.poll() is None, open(folder / "server.log").read()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    result["server_up_seconds"] = round(time.perf_counter() - start, 1)

    def completion(prompt: str) -> str:
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
        return httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

    def chat(messages: list[dict]) -> str:
        body = {"messages": messages, "max_tokens": n, "temperature": 0}
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"][
            "content"]

    def response(prompt: str) -> str:
        body = {"input": prompt, "max_output_tokens": n, "temperature": 0}
        return httpx.post(url + "/v1/responses", json=body, timeout=120).json()["output"][0]["content"][0]["text"]

    def streamed_response(prompt: str) -> str:
        body = {"input": prompt, "max_output_tokens": n, "temperature": 0, "stream": True}
        text = ""
        with httpx.stream("POST", url + "/v1/responses", json=body, timeout=120) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] == "response.output_text.delta":
                        text += event["delta"]
        return text

    with ThreadPoolExecutor(4) as pool:  # (4 clients at once: the rounds batch them)
        got_completions = list(pool.map(completion, PROMPTS))
        got_chats = list(pool.map(chat, chats))
        got_responses = list(pool.map(response, PROMPTS))
        got_streamed = list(pool.map(streamed_response, PROMPTS))
    result["server_completions_equal_offline"] = sum(a == b for a, b in zip(got_completions, want_completions))
    result["server_chats_equal_offline"] = sum(a == b for a, b in zip(got_chats, want_chats))
    result["server_responses_equal_offline_chat"] = sum(a == b for a, b in zip(got_responses, want_chats))
    result["server_streamed_responses_equal_offline_chat"] = sum(a == b for a, b in zip(got_streamed, want_chats))

    # SIGTERM with a stream in flight: it finishes, and the server exits 0.
    body = {"prompt": "the end", "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
    chunks, finished = 0, False
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
                if chunks == 3:
                    server.send_signal(signal.SIGTERM)
            finished = finished or line == "data: [DONE]"
    result["stream_after_sigterm_finished"] = finished
    result["server_exit_status"] = server.wait(60)
    log.seek(0)
    result["server_log_tail"] = log.read()[-2000:]

    lines = [json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": m, "max_tokens": n, "temperature": 0}}) for i, m in enumerate(chats)]
    batch = subprocess.run([sys.executable, "-m", "treeflash.cli", "run-batch", "-i", "-", "-o", "-", "--model",
                            str(target), "--draft-model", str(drafter), "--tree-budget", "8", "--device", args.device,
                            "--dtype", "float32", "--max-num-seqs", "4"], input="\n".join(lines) + "\n",
                           capture_output=True, text=True, env=env, timeout=600)
    result["run_batch_exit_status"] = batch.returncode
    answers = [json.loads(x)["response"]["body"]["choices"][0]["message"]["content"]
               for x in batch.stdout.splitlines()] if batch.returncode == 0 else []
    result["run_batch_equal_offline"] = sum(a == b for a, b in zip(answers, want_chats))
    result["run_batch_stderr_tail"] = batch.stderr[-600:]
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
