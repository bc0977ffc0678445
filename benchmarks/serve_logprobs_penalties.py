"""Log-probs and penalties through `treeflash serve` with the real `openai` client.

  treeflash serve --api-key secret --port 8000 &                  # the default pair (DDTree)
  treeflash serve --api-key secret --port 8001 --spec none &      # plain decoding
  python benchmarks/serve_logprobs_penalties.py --api-key secret --urls http://127.0.0.1:8000,http://127.0.0.1:8001 \
      --out benchmarks/serve/logprobs_penalties.json

For each server: a greedy chat answer with logprobs + top_logprobs 3 and a greedy completion with logprobs 3,
each streamed and not. Checks, per server, that the streamed entries hold the non-streamed tokens and log-probs
(how far apart) and that the entries' bytes join into the text (the stop token's aside); across servers, that the tokens are the same and
how far their log-probs lie apart (the speculative server reads them from its tree's verify pass). Then a
greedy chat answer with penalties (repetition 1.3, presence 0.5, frequency 0.3) on each server: the same
tokens on all of them, and not those of the same request without penalties.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROMPT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]


def run(url: str, key: str, max_tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    chat = dict(model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=3)
    whole = client.chat.completions.create(**chat)
    content = [(c.token, c.logprob, c.bytes, [(t.token, t.logprob) for t in c.top_logprobs])
               for c in whole.choices[0].logprobs.content]
    streamed = [(c.token, c.logprob, c.bytes, [(t.token, t.logprob) for t in c.top_logprobs])
                for chunk in client.chat.completions.create(**chat, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content]
    text = whole.choices[0].message.content
    joined = b"".join(bytes(b) for _, _, b, _ in content).decode("utf-8", errors="replace")
    done = dict(model=model, prompt="def is_prime(n):", max_tokens=max_tokens, temperature=0, logprobs=3)
    legacy = client.completions.create(**done).choices[0]
    legacy_streamed = [lp for chunk in client.completions.create(**done, stream=True)
                       if chunk.choices and chunk.choices[0].logprobs for lp in chunk.choices[0].logprobs.token_logprobs]
    penalised = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0,
                                               presence_penalty=0.5, frequency_penalty=0.3,
                                               extra_body={"repetition_penalty": 1.3}).choices[0].message.content
    return {"url": url, "model": model, "penalised_chat_text": penalised, "chat_text": text, "chat_tokens": [c[0] for c in content],
            "chat_logprobs": [c[1] for c in content], "chat_top": [c[3] for c in content],
            # (the same tokens; on a speculative server the values may differ in the last bits, as each request's
            # rounds verify trees of the sizes its automatic budget chose)
            "chat_streamed_same_tokens": [c[0] for c in streamed] == [c[0] for c in content],
            "chat_streamed_max_abs_difference": max(abs(a[1] - b[1]) for a, b in zip(streamed, content)),
            "chat_bytes_join_into_text": joined.startswith(text),
            "completion_text": legacy.text, "completion_tokens": legacy.logprobs.tokens,
            "completion_logprobs": legacy.logprobs.token_logprobs,
            "completion_streamed_max_abs_difference": max(abs(a - b) for a, b in zip(legacy_streamed,
                                                                                     legacy.logprobs.token_logprobs)),
            "completion_offsets_within_text": all(0 <= o <= len(legacy.text) for o in legacy.logprobs.text_offset)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", required=True, help="comma-separated server URLs (the first is compared to the rest)")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    runs = [run(url, args.api_key, args.max_tokens) for url in args.urls.split(",")]
    report = {"command": "python " + " ".join(sys.argv), "runs": runs, "comparisons": []}
    for other in runs[1:]:
        pairs = [(a, b) for key in ("chat", "completion")
                 for a, b in zip(runs[0][f"{key}_logprobs"], other[f"{key}_logprobs"])]
        report["comparisons"].append({
            "urls": [runs[0]["url"], other["url"]],
            "same_chat_tokens": runs[0]["chat_tokens"] == other["chat_tokens"],
            "same_completion_tokens": runs[0]["completion_tokens"] == other["completion_tokens"],
            "same_penalised_chat_text": runs[0]["penalised_chat_text"] == other["penalised_chat_text"],
            "max_abs_logprob_difference": max(abs(a - b) for a, b in pairs)})
    for r in runs:
        print(f"{r['url']}: chat {len(r['chat_tokens'])} tokens (streamed: same tokens {r['chat_streamed_same_tokens']}, "
              f"log-probs within {r['chat_streamed_max_abs_difference']:.1e}; bytes join into the text "
              f"{r['chat_bytes_join_into_text']}), completion {len(r['completion_tokens'])} tokens (streamed log-probs "
              f"within {r['completion_streamed_max_abs_difference']:.1e})")
    print("penalties change the greedy answer:", all(r["penalised_chat_text"] != r["chat_text"] for r in runs))
    for c in report["comparisons"]:
        print(json.dumps(c))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
