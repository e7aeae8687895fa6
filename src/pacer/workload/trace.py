"""Trace replay: JSONL, one request per line, into `RequestSpec`s with their send times.

Keys: `timestamp` (seconds from the start; absolute epoch times are shifted so the first is
0), `prompt` (text) or `prompt_tokens` (a length), `output_tokens`, and optional `class`,
`session`, `tenant`, `priority`. pacer's own `--request-log` is a valid trace. When only
lengths are given, text is synthesised (see `pacer.workload.text`); a session's later turn whose
prompt is long enough starts with the previous turn's prompt and reply, so replays keep the
prefix sharing of the original traffic.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pacer.workload.spec import ChatMessage, RequestSpec
from pacer.workload.text import TextSource, TokenizerLike

__all__ = ["load_trace", "specs_from_trace"]


def load_trace(path: str | Path, *, tokenizer: TokenizerLike | None = None, seed: int = 0,
               default_output_tokens: int = 128) -> list[RequestSpec]:
    """Read a JSONL trace (blank lines and lines starting with # are skipped)."""
    rows: list[Mapping[str, Any]] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
        if not isinstance(row, Mapping):
            raise ValueError(f"{path}:{lineno}: expected a JSON object per line")
        rows.append(row)
    return specs_from_trace(rows, tokenizer=tokenizer, seed=seed, default_output_tokens=default_output_tokens,
                            source=str(path))


def _int(row: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = row.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: {key} must be a number >= 0, got {value!r}")
    return int(value)


def specs_from_trace(rows: list[Mapping[str, Any]], *, tokenizer: TokenizerLike | None = None, seed: int = 0,
                     default_output_tokens: int = 128, source: str = "trace") -> list[RequestSpec]:
    text = TextSource(tokenizer)
    rng = random.Random(f"{seed}:trace")
    last_in_session: dict[str, tuple[tuple[int, ...], int]] = {}   # session -> (prompt ids, output len)
    t0: float | None = None
    specs: list[RequestSpec] = []
    for i, row in enumerate(rows):
        where = f"{source}: request {i}"
        if "timestamp" not in row:
            raise ValueError(f"{where}: missing 'timestamp'")
        ts = float(row["timestamp"])
        t0 = ts if t0 is None else min(t0, ts)
        out_len = max(1, _int(row, "output_tokens", where, default_output_tokens))
        session = row.get("session")
        session = None if session is None else str(session)
        if isinstance(row.get("prompt"), str) and row["prompt"]:
            prompt: str = row["prompt"]
            ids = tuple(text.tokenizer.encode(prompt))
        elif "prompt_tokens" in row:
            n = max(1, _int(row, "prompt_tokens", where))
            ids = _synth_ids(text, rng, n, last_in_session.get(session) if session else None)
            prompt = text.tokenizer.decode(ids)
        else:
            raise ValueError(f"{where}: needs 'prompt' (text) or 'prompt_tokens' (a length)")
        if session is not None:
            last_in_session[session] = (ids, out_len)
        specs.append(RequestSpec(
            request_id=f"trace-{i}", request_class=str(row.get("class") or "trace"),
            prompt=prompt, prompt_token_ids=ids, output_tokens=out_len,
            messages=(ChatMessage("user", prompt.strip()),), arrival_time=ts, session=session,
            tenant=str(row.get("tenant") or "default"), priority=int(row.get("priority") or 0),
            ignore_eos=bool(row.get("ignore_eos", True)),
        ))
    shift = t0 or 0.0
    specs = [s.with_arrival((s.arrival_time or 0.0) - shift) for s in specs]
    specs.sort(key=lambda s: s.arrival_time or 0.0)
    return specs


def _synth_ids(text: TextSource, rng: random.Random, n: int,
               previous: tuple[tuple[int, ...], int] | None) -> tuple[int, ...]:
    if previous is not None:
        prev_ids, prev_out = previous
        reply = text.segment(prev_out, rng).token_ids
        base = prev_ids + reply
        if len(base) < n:
            return base + text.segment(n - len(base), rng).token_ids
    return text.segment(n, rng).token_ids
