"""The ingress's request path, apart from Ray: admit at the gate (`pacer.deploy.gate`), send
to a replica, relay its answer. `send(route, forwarded)` is a replica handle's `remote` (a
stream of {"status", "headers"}, then {"body"} chunks, then {"output_tokens"}); a replica
that dies or cannot be reached gives a clear 503, never a hang."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pacer.deploy.gate import Gate, Ticket, relayed_headers
from pacer.server.api import errors
from pacer.server.api.errors import APIError

__all__ = ["forward", "refused"]


async def forward(gate: Gate, request: Request, send: Callable[[Any, dict[str, Any]], Any],
                  generate: bool = False) -> Response:
    """One request: refused at the gate (naming no replica) or relayed from a replica."""
    try:
        ticket = await gate.admit(request, generate)
    except APIError as e:   # refused before any work, and before any replica is chosen
        return refused(e)
    gen = send(ticket.route, ticket.forwarded)
    try:
        start = await gen.__anext__()
    except BaseException as exc:   # the replica died or is unreachable (or the client left)
        gate.finish(ticket)
        gen.cancel()
        if isinstance(exc, Exception):
            return _unavailable(exc)
        raise
    headers = relayed_headers(start["status"], start["headers"])
    if "text/event-stream" not in headers.get("content-type", ""):
        usage: dict[str, int] = {}
        chunks: list[bytes] = []
        try:
            async for item in gen:
                if "body" in item:
                    chunks.append(item["body"])
                usage.update(item.get("output_tokens") or {})
        except Exception as exc:
            return _unavailable(exc)
        finally:
            gate.finish(ticket, usage)
        return Response(b"".join(chunks), status_code=start["status"], headers=headers)
    gate.started(ticket)
    return StreamingResponse(_relay(gen, gate, ticket), status_code=start["status"], headers=headers)


async def _relay(gen: Any, gate: Gate, ticket: Ticket) -> AsyncIterator[bytes]:
    usage: dict[str, int] = {}
    try:
        async for item in gen:
            if "body" in item:
                yield item["body"]
            usage.update(item.get("output_tokens") or {})
    except Exception as exc:   # the replica died mid-stream: an error event, then the end
        body = errors.unavailable(f"the replica serving this request failed: {type(exc).__name__}").body()
        yield f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
    finally:
        gate.finish(ticket, usage)
        gen.cancel()


def refused(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _unavailable(exc: BaseException) -> JSONResponse:
    e = errors.unavailable(f"no replica could serve this request ({type(exc).__name__}: {exc})"[:500])
    return JSONResponse(e.body(), status_code=e.status)
