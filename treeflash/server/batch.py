"""`treeflash run-batch`: a file in OpenAI's batch format, answered offline through the server's own routes.

Each input line is `{"custom_id", "method": "POST", "url", "body"}` for /v1/completions,
/v1/chat/completions or /v1/responses. The lines go to the server's app in this process (through httpx's
ASGI transport: no port, no network), many at once, so the engine batches them as it batches a server's
clients; each answer is exactly what `treeflash serve` would have sent. An output line is written for
every input line, in the input's order, as soon as it and those before it are done (a run stopped half-way
keeps what it finished); the input is read as it goes, at most twice `concurrency` lines ahead of the output,
so a file of any length runs in bounded memory:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`,
a refused request's 4xx and error body in `response` as OpenAI's batch output has them, and a line that
is no request at all (not JSON, no custom_id, another method or URL) as `error` with `response` null.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

URLS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


@dataclass
class BatchCounts:
    lines: int = 0
    succeeded: int = 0  # answered 200
    refused: int = 0  # answered 4xx or 5xx (in `response`)
    malformed: int = 0  # no request (in `error`)


async def run_batch(app, lines: Iterable[str], write: Callable[[str], None], concurrency: int,
                    progress=None) -> BatchCounts:
    """Answer every non-empty line of `lines` through `app`, at most `concurrency` at a time, calling
    `write` with each output line (newline included) in the input's order. `lines` is read on a worker
    thread as the answers go out (a pipe that is slow to give its next line holds up no answer)."""
    import httpx

    counts = BatchCounts()
    gate = asyncio.Semaphore(concurrency)
    source = iter(lines)
    ahead: deque[asyncio.Task] = deque()  # the lines read and not yet written, in the input's order
    async with app.router.lifespan_context(app):  # (the app's start and stop, as a server's: the engine loop's)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://batch", timeout=None) as client:

            async def answer(line: str) -> dict:
                async with gate:
                    return await _answer_line(client, line, counts)

            async def write_oldest() -> None:
                write(json.dumps(await ahead.popleft(), ensure_ascii=False) + "\n")
                if progress is not None:
                    progress.update(1)

            try:
                while (line := await asyncio.to_thread(next, source, None)) is not None:
                    if line.strip():
                        counts.lines += 1
                        ahead.append(asyncio.create_task(answer(line)))
                        if len(ahead) >= 2 * concurrency:
                            await write_oldest()
                while ahead:
                    await write_oldest()
            finally:
                for task in ahead:
                    task.cancel()
    return counts


async def _answer_line(client, line: str, counts: BatchCounts) -> dict:
    entry = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": None, "response": None, "error": None}
    try:
        item = json.loads(line)
    except ValueError as e:
        return _malformed(entry, counts, "invalid_json", f"the line is not JSON: {e}")
    if not isinstance(item, dict):
        return _malformed(entry, counts, "invalid_request", "the line must be a JSON object")
    entry["custom_id"] = item.get("custom_id")
    if not isinstance(entry["custom_id"], str):
        return _malformed(entry, counts, "invalid_request", "custom_id must be a string")
    if item.get("method") != "POST" or item.get("url") not in URLS:
        return _malformed(entry, counts, "invalid_request", f"method must be POST and url one of {', '.join(URLS)}; "
                                                            f"got {item.get('method')!r} {item.get('url')!r}")
    body = item.get("body")
    if not isinstance(body, dict):
        return _malformed(entry, counts, "invalid_request", "body must be a JSON object (the request's body)")
    if body.get("stream"):
        return _malformed(entry, counts, "invalid_request", "stream is not available in a batch (each line gets "
                                                            "its whole answer)")
    answer = await client.post(item["url"], json=body)
    if answer.status_code == 200:
        counts.succeeded += 1
    else:
        counts.refused += 1
    entry["response"] = {"status_code": answer.status_code, "request_id": uuid.uuid4().hex, "body": answer.json()}
    return entry


def _malformed(entry: dict, counts: BatchCounts, code: str, message: str) -> dict:
    counts.malformed += 1
    entry["error"] = {"code": code, "message": message}
    return entry
