"""Send `treeflash serve` every kind of bad input and record its answers (the README's table).

  treeflash serve --api-key secret &
  python benchmarks/serve_bad_inputs.py --api-key secret --out benchmarks/serve/bad_inputs.json

After each bad request a good one is sent: it must succeed (the server keeps serving everyone else).
Prints a markdown table of input, HTTP status, error type/code/param and message.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cases(model: str, context: int) -> list[tuple[str, str, str, object, dict | None]]:
    """(what, method, route, body: bytes | dict | None, headers or None for the valid key)."""
    chat = [{"role": "user", "content": "Hi"}]
    long_text = "tree " * context
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    return [
        ("malformed JSON", "POST", "chat/completions", b'{"model": "x", "messages": [', None),
        ("a JSON array, not an object", "POST", "chat/completions", b"[1, 2]", None),
        ("NaN (not JSON)", "POST", "completions", b'{"prompt": "x", "temperature": NaN}', None),
        ("missing `messages`", "POST", "chat/completions", {"model": model}, None),
        ("missing `prompt`", "POST", "completions", {"model": model, "max_tokens": 4}, None),
        ("`prompt` a number", "POST", "completions", {"model": model, "prompt": 7}, None),
        ("`max_tokens` a string", "POST", "completions", {"model": model, "prompt": "x", "max_tokens": "5"}, None),
        ("`stream` a string", "POST", "chat/completions", {"model": model, "messages": chat, "stream": "yes"}, None),
        ("`n` a bool", "POST", "chat/completions", {"model": model, "messages": chat, "n": True}, None),
        ("message `content` a number", "POST", "chat/completions",
         {"model": model, "messages": [{"role": "user", "content": 5}]}, None),
        ("message without `content`", "POST", "chat/completions",
         {"model": model, "messages": [{"role": "user"}]}, None),
        ("unknown role", "POST", "chat/completions", {"model": model, "messages": [{"role": "wizard", "content": "x"}]},
         None),
        ("empty `messages`", "POST", "chat/completions", {"model": model, "messages": []}, None),
        ("empty prompt", "POST", "completions", {"model": model, "prompt": ""}, None),
        ("temperature -1", "POST", "chat/completions", {"model": model, "messages": chat, "temperature": -1}, None),
        ("top_p 0", "POST", "chat/completions", {"model": model, "messages": chat, "top_p": 0}, None),
        ("top_p 1.5", "POST", "chat/completions", {"model": model, "messages": chat, "top_p": 1.5}, None),
        ("top_k -2", "POST", "chat/completions", {"model": model, "messages": chat, "top_k": -2}, None),
        ("min_p 2", "POST", "chat/completions", {"model": model, "messages": chat, "min_p": 2}, None),
        ("max_tokens 0", "POST", "chat/completions", {"model": model, "messages": chat, "max_tokens": 0}, None),
        ("seed 1.5", "POST", "chat/completions", {"model": model, "messages": chat, "seed": 1.5}, None),
        ("empty stop string", "POST", "chat/completions", {"model": model, "messages": chat, "stop": [""]}, None),
        ("n 0", "POST", "chat/completions", {"model": model, "messages": chat, "n": 0}, None),
        ("n 1000 (too large)", "POST", "chat/completions", {"model": model, "messages": chat, "n": 1000}, None),
        ("prompt longer than the context", "POST", "completions", {"model": model, "prompt": long_text}, None),
        ("messages longer than the context", "POST", "chat/completions",
         {"model": model, "messages": [{"role": "user", "content": long_text}]}, None),
        ("prompt + max_tokens over the context", "POST", "chat/completions",
         {"model": model, "messages": chat, "max_tokens": context}, None),
        ("token ids outside the vocabulary", "POST", "completions", {"model": model, "prompt": [1, 2, 10 ** 9]}, None),
        ("unknown model", "POST", "chat/completions", {"model": "gpt-4o", "messages": chat}, None),
        ("top_logprobs 21 (at most 20)", "POST", "chat/completions",
         {"model": model, "messages": chat, "logprobs": True, "top_logprobs": 21}, None),
        ("presence_penalty 3 (at most 2)", "POST", "chat/completions",
         {"model": model, "messages": chat, "presence_penalty": 3}, None),
        ("logit_bias 200 (at most 100)", "POST", "chat/completions",
         {"model": model, "messages": chat, "logit_bias": {"5": 200}}, None),
        ("prompt_logprobs with stream", "POST", "completions",
         {"model": model, "prompt": "x", "prompt_logprobs": 1, "stream": True}, None),
        ("guided_grammar (unsupported)", "POST", "completions",
         {"model": model, "prompt": "x", "guided_grammar": "root ::= \"x\""}, None),
        ("two structures at once", "POST", "chat/completions",
         {"model": model, "messages": chat, "guided_choice": ["a", "b"], "guided_regex": "[ab]"}, None),
        ("a regex that does not parse", "POST", "chat/completions",
         {"model": model, "messages": chat, "guided_regex": "(ab"}, None),
        ("a regex whose automaton explodes (2**25 states)", "POST", "chat/completions",
         {"model": model, "messages": chat, "guided_regex": "(a|b)*a(a|b){24}"}, None),
        ("tools for a template that shows none", "POST", "chat/completions",
         {"model": model, "messages": chat, "tools": [tool]}, None),
        ("tool_choice required without tools", "POST", "chat/completions",
         {"model": model, "messages": chat, "tool_choice": "required"}, None),
        ("a tool call's arguments not JSON", "POST", "chat/completions",
         {"model": model, "messages": chat + [{"role": "assistant", "content": None, "tool_calls": [
             {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{tz: 1}"}}]}]}, None),
        ("stream_options without stream", "POST", "chat/completions",
         {"model": model, "messages": chat, "stream_options": {"include_usage": True}}, None),
        ("no API key", "GET", "models", None, {}),
        ("wrong API key", "POST", "chat/completions", {"model": model, "messages": chat},
         {"Authorization": "Bearer wrong"}),
        ("unknown route", "GET", "nothing", None, None),
        ("wrong method", "GET", "chat/completions", None, None),
    ]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", required=True, help="the server must be started with this key")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import httpx

    auth = {"Authorization": f"Bearer {args.api_key}"}
    card = httpx.get(args.url + "/v1/models", headers=auth, timeout=30).json()["data"][0]
    rows = []
    for what, method, route, body, headers in cases(card["id"], card["max_model_len"]):
        content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        answer = httpx.request(method, f"{args.url}/v1/{route}", content=content, timeout=120,
                               headers={"Content-Type": "application/json", **(auth if headers is None else headers)})
        error = answer.json().get("error", {}) if answer.headers.get("content-type", "").startswith(
            "application/json") else {}
        good = httpx.post(f"{args.url}/v1/chat/completions", headers=auth, timeout=300, json={
            "model": card["id"], "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
            "temperature": 0})
        rows.append({"input": what, "status": answer.status_code, "type": error.get("type"),
                     "code": error.get("code"), "param": error.get("param"), "message": error.get("message"),
                     "next_good_request": good.status_code})
    print("| input | status | code / param | message | next good request |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        message = (r["message"] or "").replace("|", "\\|")
        message = message if len(message) <= 110 else message[:107] + "..."
        print(f"| {r['input']} | {r['status']} | {r['code'] or '-'} / {r['param'] or '-'} | {message} | "
              f"{r['next_good_request']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    bad = [r for r in rows if not 400 <= r["status"] < 500 or r["next_good_request"] != 200]
    if bad:
        print(f"{len(bad)} inputs were not answered 4xx or broke the next request", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
