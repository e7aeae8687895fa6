"""A tiny scripted OpenAI-compatible streaming server for client tests (run as a subprocess).

`python scripted_server.py '{"ttft": 0.04, "gaps": [0.01, 0.03]}'` prints its port on stdout,
then serves /v1/models, /v1/completions and /v1/chat/completions (SSE): the first token
`ttft` seconds after the request is read, then one token per `gaps` entry (cycled) up to
`max_tokens`, then a usage chunk (cached_tokens 7) and [DONE]. tenant "reject" gets a 429,
tenant "fail" a 500. GET /log returns, per request, its prompt, when it was read and when
each token was written ([before, after] the write), on `time.perf_counter()` (CLOCK_MONOTONIC: comparable across
processes), so tests can check client timing against what was actually sent.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

CONFIG: dict[str, Any] = {"ttft": 0.04, "gaps": [0.01, 0.03, 0.02]}
LOG: list[dict[str, Any]] = []


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, Any]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    request_line, *header_lines = head.split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
    body: dict[str, Any] = {}
    n = int(headers.get("content-length", "0"))
    if n:
        body = json.loads(await reader.readexactly(n))
    return method, path, body


def _response(status: str, payload: Any) -> bytes:
    data = json.dumps(payload).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n").encode() + data


async def _stream(writer: asyncio.StreamWriter, path: str, body: dict[str, Any], received: float) -> None:
    chat = path.endswith("/chat/completions")
    prompt = body["messages"][-1]["content"] if chat else body["prompt"]
    entry: dict[str, Any] = {"prompt": prompt, "received_at": received, "sent_at": [], "body": body}  # sent_at: [before, after]
    LOG.append(entry)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    n = int(body.get("max_tokens", 16))
    gaps = CONFIG["gaps"]
    due = received + CONFIG["ttft"]
    for i in range(n):
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        piece = f" tok{i}"
        choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
        if i == n - 1:
            choice["finish_reason"] = "length"
        data = f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
        before = time.perf_counter()
        writer.write(data)   # asyncio sends at once when its buffer is empty: on loopback the
        after = time.perf_counter()   # bytes are in the client's socket between these two stamps
        entry["sent_at"].append([before, after])
        await writer.drain()
        due += gaps[i % len(gaps)]
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n, "total_tokens": n + len(prompt.split()),
             "prompt_tokens_details": {"cached_tokens": 7}}
    writer.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    await writer.drain()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        method, path, body = await _read_request(reader)
        received = time.perf_counter()
        if method == "GET" and path == "/v1/models":
            writer.write(_response("200 OK", {"object": "list", "data": [{"id": "scripted", "object": "model"}]}))
        elif method == "GET" and path == "/log":
            writer.write(_response("200 OK", LOG))
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            tenant = body.get("tenant")
            if tenant == "reject":
                writer.write(_response("429 Too Many Requests", {"error": {"message": "queue full"}}))
            elif tenant == "fail":
                writer.write(_response("500 Internal Server Error", {"error": {"message": "boom"}}))
            else:
                await _stream(writer, path, body, received)
        else:
            writer.write(_response("404 Not Found", {"error": {"message": "no route"}}))
        await writer.drain()
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        CONFIG.update(json.loads(sys.argv[1]))
    asyncio.run(main())
