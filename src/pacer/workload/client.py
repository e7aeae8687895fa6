"""Async streaming client for any OpenAI-compatible server (pacer, vLLM, SGLang, TGI).

One `OpenAIClient.send(spec, t0)` streams one request and returns its `RequestRecord`: the
send time, a timestamp per streamed chunk with text (client-side TTFT and every inter-token
gap), the finish time, errors by HTTP status (429 counted as rejected), and the server's usage
(prompt, completion and cached tokens) when it reports it. Requests run as independent tasks
on one connection pool without a connection limit, so a slow request never blocks another.
Times are `time.perf_counter()` minus `t0` (the run's start).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import httpx

from pacer.config.slo import REQUEST_CLASSES
from pacer.workload.report import STATUS_ERROR, STATUS_REJECTED, RequestRecord
from pacer.workload.spec import RequestSpec

__all__ = ["OpenAIClient", "ENDPOINTS"]

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class OpenAIClient:
    """`async with OpenAIClient(base_url, endpoint="completions") as c: rec = await c.send(spec, t0)`."""

    def __init__(self, base_url: str, *, model: str | None = None, endpoint: str = "completions",
                 temperature: float = 0.0, timeout: float = 600.0, api_key: str | None = None,
                 extra_body: Mapping[str, Any] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.model = model
        self.endpoint = endpoint
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, transport=transport,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def models(self) -> list[dict[str, Any]]:
        r = await self._http.get("/v1/models")
        r.raise_for_status()
        data = r.json().get("data", [])
        return [m for m in data if isinstance(m, dict)]

    async def metrics_text(self) -> str:
        """The server's Prometheus `/metrics` text (raises for an HTTP error)."""
        r = await self._http.get("/metrics")
        r.raise_for_status()
        return r.text

    async def resolve_model(self) -> str:
        """`model` if given, else the first model `/v1/models` lists."""
        if self.model is None:
            listed = await self.models()
            if not listed:
                raise ValueError(f"{self.base_url}/v1/models lists no model; pass --model")
            self.model = str(listed[0]["id"])
        return self.model

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": spec.output_tokens, "temperature": self.temperature,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if self.endpoint == "chat":
            body["messages"] = [m.as_dict() for m in spec.messages]
        else:
            body["prompt"] = spec.prompt
        if spec.ignore_eos:
            body["ignore_eos"] = True       # vLLM / SGLang / pacer extension: force the output length
        if spec.priority != 0:
            body["priority"] = spec.priority
        if spec.tenant != "default":
            body["tenant"] = spec.tenant
        body.update(self.extra_body)
        return body

    async def send(self, spec: RequestSpec, t0: float) -> RequestRecord:
        """Stream one request; never raises for server or network errors (they land in the record)."""
        return (await self.send_with_text(spec, t0))[0]

    async def send_with_text(self, spec: RequestSpec, t0: float,
                             headers: Mapping[str, str] | None = None) -> tuple[RequestRecord, str]:
        """`send` with extra `headers` (an agent loop's `x-session-id`), also returning the text
        streamed back (an agent loop appends it to its history)."""
        text = ""
        rec = RequestRecord(request_id=spec.request_id, request_class=spec.request_class,
                            arrival_time=time.perf_counter() - t0, prompt_tokens=spec.prompt_tokens,
                            tenant=spec.tenant, priority=spec.priority, session=spec.session)
        usage: dict[str, Any] = {}
        try:
            sent = {"x-pacer-class": spec.request_class} if spec.request_class in REQUEST_CLASSES else {}
            sent.update(headers or {})
            async with self._http.stream("POST", ENDPOINTS[self.endpoint], json=self.body(spec),
                                         headers=sent) as resp:
                rec.http_status = resp.status_code
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    rec.status = STATUS_REJECTED if resp.status_code == 429 else STATUS_ERROR
                    rec.error = _error_message(text) or f"HTTP {resp.status_code}"
                    rec.finish_time = time.perf_counter() - t0
                    return rec, text
                async for line in resp.aiter_lines():
                    now = time.perf_counter() - t0
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk and not chunk.get("choices"):
                        raise _StreamError(_error_message(json.dumps(chunk)) or "error in stream")
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    piece = self._chunk_text(chunk)
                    text += piece
                    if piece:
                        if rec.first_token_time is None:
                            rec.first_token_time = now
                        rec.token_times.append(now)
        except (httpx.HTTPError, _StreamError, json.JSONDecodeError, OSError) as e:
            rec.status = STATUS_ERROR
            rec.error = f"{type(e).__name__}: {e}"
        rec.finish_time = time.perf_counter() - t0
        self._apply_usage(rec, usage)
        return rec, text

    def _chunk_text(self, chunk: Mapping[str, Any]) -> str:
        text = ""
        for choice in chunk.get("choices") or []:
            if self.endpoint == "chat":
                text += (choice.get("delta") or {}).get("content") or ""
            else:
                text += choice.get("text") or ""
        return text

    @staticmethod
    def _apply_usage(rec: RequestRecord, usage: Mapping[str, Any]) -> None:
        rec.output_tokens = len(rec.token_times)
        if not usage:
            return
        rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
        rec.output_tokens = int(usage.get("completion_tokens") or rec.output_tokens)
        details = usage.get("prompt_tokens_details") or {}
        rec.cached_tokens = int(details.get("cached_tokens") or 0)


class _StreamError(Exception):
    pass


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:500]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err)[:500]
    return str(err)[:500]
