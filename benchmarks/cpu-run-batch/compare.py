"""`treeflash run-batch` on MT-Bench first turns against `LLM.chat` on the same prompts, in one process each.

Writes the batch file (one /v1/chat/completions line a question, greedy), runs `treeflash run-batch` on it
with the default pair (DDTree, the engine's defaults) and `--max-num-seqs S`, then answers the same
conversations with `LLM.chat` (default pair, `max_num_seqs=S`) and `LLM(spec="none").chat` (plain decoding,
one at a time), and compares every text. Times: the run-batch process's whole wall time (model load
included), and that of a run-batch process answering one one-token line (its fixed cost); offline,
`chat`'s call alone.

    python benchmarks/cpu-run-batch/compare.py --num-prompts 16 --max-tokens 64 --slots 8 --out compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from treeflash import LLM, SamplingParams
    from treeflash.bench.datasets import load_prompts

    prompts = load_prompts("mtbench", args.num_prompts)
    with tempfile.TemporaryDirectory() as folder:
        requests, answers = Path(folder) / "requests.jsonl", Path(folder) / "answers.jsonl"
        requests.write_text("".join(json.dumps({"custom_id": p.id, "method": "POST", "url": "/v1/chat/completions",
                                                "body": {"messages": list(p.messages), "temperature": 0,
                                                         "max_tokens": args.max_tokens}}) + "\n" for p in prompts))
        one = Path(folder) / "one.jsonl"  # (a one-token line: the process's fixed cost, model load included)
        one.write_text(json.dumps({"custom_id": "one", "method": "POST", "url": "/v1/completions",
                                   "body": {"prompt": "Hi", "max_tokens": 1}}) + "\n")

        def run_batch(path: Path) -> tuple[float, subprocess.CompletedProcess]:
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "treeflash", "run-batch", "-i", str(path), "-o",
                                   str(answers), "--max-num-seqs", str(args.slots)], capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
            assert done.returncode == 0, done.stderr
            return time.perf_counter() - start, done

        fixed_seconds, _ = run_batch(one)
        batch_seconds, done = run_batch(requests)
        out = [json.loads(line) for line in answers.read_text().splitlines()]
    batch_texts = [o["response"]["body"]["choices"][0]["message"]["content"] for o in out]
    batch_tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in out)

    conversations = [list(p.messages) for p in prompts]
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    pair = LLM(max_num_seqs=args.slots)
    start = time.perf_counter()
    pair_texts = [o.text for o in pair.chat(conversations, greedy, use_tqdm=False)]
    pair_seconds = time.perf_counter() - start
    plain = LLM(spec="none", max_num_seqs=1)
    plain_texts = [plain.chat(c, greedy, use_tqdm=False)[0].text for c in conversations]

    result = {
        "command": " ".join(["python", "benchmarks/cpu-run-batch/compare.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M"), "prompts": len(prompts), "max_tokens": args.max_tokens,
        "slots": args.slots, "run_batch_process_seconds": round(batch_seconds, 2),
        "run_batch_one_token_process_seconds": round(fixed_seconds, 2),
        "run_batch_summary": done.stderr.strip().splitlines()[-1], "completion_tokens": batch_tokens,
        "llm_chat_seconds": round(pair_seconds, 2),
        "run_batch_equal_llm_chat": sum(a == b for a, b in zip(batch_texts, pair_texts)),
        "run_batch_equal_plain_decoding": sum(a == b for a, b in zip(batch_texts, plain_texts)),
    }
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
