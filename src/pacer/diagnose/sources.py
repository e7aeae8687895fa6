"""Sources -> `Source`: pacer's request log, `pacer bench` / `pacer sim` run files, and plain
CSV / JSONL tables from any stack with the seed's columns.

Table columns (case-insensitive; a unit suffix such as ``ttft_ms`` states the unit, else
``--time-unit``, default seconds; cells may also carry their unit, ``"350ms"``):

==================  ======================================================  ========
column              aliases                                                 required
==================  ======================================================  ========
``input_tokens``    ``prompt_tokens``                                       yes
``output_tokens``   ``completion_tokens``                                   yes
``ttft``            ``time_to_first_token``                                 yes
``total_latency``   ``e2e``, ``latency``                                    yes
``feature``         ``class``, ``request_class``                            no (else classified)
``queue_wait``      ``queue_time``                                          no
``itl``             ``itl_mean``                                            no
``tpot``            ``time_per_output_token``                               no
``itl_max``                                                                 no
``preemptions``     ``num_preemptions``                                     no
``preempted_time``                                                          no
``timestamp``       ``arrival``, ``arrival_time`` (seconds, epoch, or ISO)  no
``cached_tokens``                                                           no
``max_tokens``                                                              no
==================  ======================================================  ========

A bad cell is an error naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pacer.config.slo import ClassRules
from pacer.diagnose.records import Record, Source

__all__ = ["load_source", "parse_table_rows", "TIME_UNITS", "COLUMNS"]

TIME_UNITS = {"s": 1.0, "sec": 1.0, "seconds": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_OK_REASONS = ("stop", "length")


@dataclass(frozen=True, slots=True)
class Column:
    name: str                   # the Record field
    aliases: tuple[str, ...]
    kind: str                   # time | int | str
    required: bool = False


COLUMNS = (
    Column("prompt_tokens", ("input_tokens", "prompt_tokens"), "int", True),
    Column("output_tokens", ("output_tokens", "completion_tokens"), "int", True),
    Column("ttft", ("ttft", "time_to_first_token"), "time", True),
    Column("e2e", ("total_latency", "e2e", "latency"), "time", True),
    Column("request_class", ("feature", "class", "request_class"), "str"),
    Column("queue_wait", ("queue_wait", "queue_time"), "time"),
    Column("itl_mean", ("itl", "itl_mean"), "time"),
    Column("tpot", ("tpot", "time_per_output_token"), "time"),
    Column("itl_max", ("itl_max",), "time"),
    Column("preemptions", ("preemptions", "num_preemptions"), "int"),
    Column("preempted_time", ("preempted_time",), "time"),
    Column("preempted_time_ttft", ("preempted_time_ttft",), "time"),
    Column("arrival", ("timestamp", "arrival", "arrival_time"), "timestamp"),
    Column("cached_tokens", ("cached_tokens",), "int"),
    Column("max_tokens", ("max_tokens",), "int"),
)


def _match(header: str, col: Column, default_unit: float) -> float | None:
    """The unit scale when `header` names `col` (with or without a unit suffix), else None."""
    h = header.strip().lower()
    for alias in col.aliases:
        if h == alias:
            return default_unit
        if col.kind in ("time", "timestamp") and h.startswith(alias + "_") and h[len(alias) + 1:] in TIME_UNITS:
            return TIME_UNITS[h[len(alias) + 1:]]
    return None


def _bind_columns(headers: list[str], where: str, default_unit: float) -> dict[str, tuple[str, float]]:
    """Record field -> (header, unit scale); a missing required column is an error naming it."""
    bound: dict[str, tuple[str, float]] = {}
    for col in COLUMNS:
        for h in headers:
            scale = _match(h, col, default_unit)
            if scale is not None:
                bound[col.name] = (h, scale)
                break
        if col.required and col.name not in bound:
            names = " or ".join(repr(a) for a in col.aliases)
            unit = " (a unit suffix such as _ms is allowed)" if col.kind == "time" else ""
            raise ValueError(f"{where}: missing required column {names}{unit}; the columns are: "
                             f"{', '.join(headers) or '(none)'}")
    return bound


def _cell(value: Any, kind: str, scale: float, where: str) -> Any:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if kind == "str":
        return str(value).strip()
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    if kind == "timestamp" and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(value.strip().replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ValueError(f"{where}: expected seconds or an ISO-8601 time, got {value!r}") from None
    if isinstance(value, str):
        text = value.strip()
        for unit in sorted(TIME_UNITS, key=len, reverse=True):
            if kind == "time" and text.endswith(unit) and text[: -len(unit)].strip():
                return _number(text[: -len(unit)], where) * TIME_UNITS[unit]
        value = _number(text, where)
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a number >= 0, got {value!r}")
    if kind == "int":
        if value != int(value):
            raise ValueError(f"{where}: expected a whole number, got {value!r}")
        return int(value)
    return float(value) * (scale if kind == "time" else 1.0)


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{where}: expected a number, got {text!r}") from None


def parse_table_rows(rows: Iterable[tuple[int, Mapping[str, Any]]], headers: list[str], name: str, *,
                     time_unit: str = "s", rules: ClassRules | None = None,
                     column_of: Callable[[str], str] | None = None) -> Source:
    """Rows (line number, header -> cell) -> Source. `column_of(header)` names a cell's column in
    errors (CSV: its position; JSONL: its key)."""
    if time_unit not in TIME_UNITS:
        raise ValueError(f"--time-unit must be one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    bound = _bind_columns(headers, name, TIME_UNITS[time_unit])
    rules = rules or ClassRules()
    kinds = {c.name: c.kind for c in COLUMNS}
    src = Source(name, "table", has_classes="request_class" in bound)
    if "request_class" not in bound:
        src.notes.append(f"{name}: no feature/class column: classified by the server's rules "
                         f"(rag > {rules.rag_min_tokens} prompt tokens, batch: max_tokens >= "
                         f"{rules.batch_max_tokens}, else chat)")
    for lineno, row in rows:
        values: dict[str, Any] = {}
        for field, (header, scale) in bound.items():
            col = column_of(header) if column_of else repr(header)
            values[field] = _cell(row.get(header), kinds[field], scale, f"{name}:{lineno}: column {col}")
        for field in ("prompt_tokens", "output_tokens", "ttft", "e2e"):
            if values.get(field) is None:
                header = bound[field][0]
                col = column_of(header) if column_of else repr(header)
                raise ValueError(f"{name}:{lineno}: column {col}: a value is required")
        if values.get("request_class") is None:
            values["request_class"] = rules.classify(values["prompt_tokens"], values.get("max_tokens"), False)
        values["cached_tokens"] = values.get("cached_tokens") or 0
        src.records.append(Record(**values))
    _shift_times(src)
    return src


def _shift_times(src: Source) -> None:
    """Arrival times relative to the first (epoch and ISO times become seconds from the start)."""
    times = [r.arrival for r in src.records if r.arrival is not None]
    if not times:
        return
    t0 = min(times)
    if t0:
        import dataclasses

        src.records = [r if r.arrival is None else dataclasses.replace(r, arrival=r.arrival - t0)
                       for r in src.records]


def _read_csv(path: Path, time_unit: str, rules: ClassRules | None) -> Source:
    text = path.read_text(encoding="utf-8")
    dialect = csv.excel_tab if path.suffix.lower() == ".tsv" else csv.excel
    reader = csv.reader(io.StringIO(text), dialect)
    headers = next(reader, None)
    if headers is None:
        raise ValueError(f"{path}: empty file (expected a header row)")
    headers = [h.strip() for h in headers]
    position = {h: i + 1 for i, h in enumerate(headers)}

    def rows() -> Iterable[tuple[int, Mapping[str, Any]]]:
        for cells in reader:
            lineno = reader.line_num
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(headers):
                raise ValueError(f"{path}:{lineno}: {len(cells)} cells, but the header has {len(headers)} columns")
            yield lineno, dict(zip(headers, cells))

    return parse_table_rows(rows(), headers, str(path), time_unit=time_unit, rules=rules,
                            column_of=lambda h: f"{position[h]} ({h})")


def _json_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}:{e.colno}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}:1: expected a JSON object per line, got {type(obj).__name__}")
        out.append((lineno, obj))
    return out


def _is_request_log(obj: Mapping[str, Any]) -> bool:
    return {"request_id", "e2e", "finished_at", "prompt_tokens"} <= set(obj)


def _read_request_log(path: Path, rows: list[tuple[int, dict[str, Any]]]) -> Source:
    """pacer's `--request-log` (schema in `pacer.telemetry.request_log`): finished, successful requests."""
    src = Source(str(path), "request_log")
    measured = all("preempted_time" in row for _, row in rows)
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        if row.get("finish_reason") not in _OK_REASONS or row.get("ttft") is None or row.get("e2e") is None \
                or row.get("status", 200) != 200:
            src.num_skipped += 1
            continue

        def get(key: str, kind: str = "time", row: dict[str, Any] = row, where: str = where) -> Any:
            return _cell(row.get(key), kind, 1.0, f"{where}: column '{key}'")

        src.records.append(Record(
            request_class=str(row.get("class") or "default"), prompt_tokens=get("prompt_tokens", "int"),
            output_tokens=get("output_tokens", "int"), ttft=get("ttft"), e2e=get("e2e"),
            arrival=get("timestamp", "timestamp"), queue_wait=get("queue_wait"), tpot=get("tpot"),
            itl_mean=get("itl_mean"), itl_max=get("itl_max"), cached_tokens=get("cached_tokens", "int") or 0,
            preemptions=get("preemptions", "int"),
            preempted_time=get("preempted_time") if measured else None,
            preempted_time_ttft=get("preempted_time_ttft") if measured else None,
            max_tokens=get("max_tokens", "int")))
    if not measured:
        src.notes.append(f"{path}: an older request log without preempted_time: preemption loss estimated from the gaps")
    _shift_times(src)
    return src


def _read_run(path: Path, data: Mapping[str, Any]) -> Source:
    """A `pacer bench` / `pacer sim` run file (schema pacer.bench.run/1)."""
    from pacer.workload.report import Report

    try:
        report = Report.from_dict(data)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: a malformed pacer run file ({e!r})") from None
    meta = report.meta
    src = Source(str(path), "run", engine_args=dict(meta.get("engine_args") or {}))
    raw = data.get("requests", [])
    measured = all("preempted_time" in r for r in raw)
    for rec in report.records:
        if not rec.ok or rec.ttft is None or rec.e2e is None:
            src.num_skipped += 1
            continue
        itl = tuple(rec.itl)
        src.records.append(Record(
            request_class=rec.request_class, prompt_tokens=rec.prompt_tokens, output_tokens=rec.output_tokens,
            ttft=rec.ttft, e2e=rec.e2e, arrival=rec.arrival_time, queue_wait=rec.queue_wait, tpot=rec.tpot,
            itl_mean=sum(itl) / len(itl) if itl else None, itl_max=max(itl) if itl else None, itl=itl,
            cached_tokens=rec.cached_tokens, preemptions=rec.preemptions,
            preempted_time=rec.preempted_time if measured else None,
            preempted_time_ttft=rec.preempted_time_ttft if measured else None, max_tokens=rec.output_tokens))
    if meta.get("target") not in (None, "sim", "inprocess"):
        src.notes.append(f"{path}: measured over HTTP: no queue wait (prefill is all of TTFT)")
    _shift_times(src)
    return src


def load_source(path: str | Path, *, time_unit: str = "s", rules: ClassRules | None = None) -> Source:
    """Any file `pacer diagnose` reads, by its content: a run file (JSON with pacer's run schema),
    a request log (JSONL with pacer's log keys), a JSONL table, or a CSV/TSV table."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    suffix = p.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return _read_csv(p, time_unit, rules)
    text = p.read_text(encoding="utf-8")
    if suffix == ".json" or text.lstrip().startswith("{\n") or text.lstrip().startswith('{"schema"'):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if suffix == ".json":
                raise ValueError(f"{p}:{e.lineno}:{e.colno}: not JSON ({e.msg})") from None
            data = None
        if isinstance(data, dict) and "schema" in data:
            return _read_run(p, data)
        if suffix == ".json":
            raise ValueError(f"{p}: not a pacer run file (expected schema pacer.bench.run/1); "
                             "give tables as .csv or .jsonl")
    rows = _json_lines(p)
    if not rows:
        raise ValueError(f"{p}: no records")
    if _is_request_log(rows[0][1]):
        return _read_request_log(p, rows)
    headers = list(dict.fromkeys(k for _, row in rows for k in row))
    return parse_table_rows(rows, headers, str(p), time_unit=time_unit, rules=rules,
                            column_of=lambda h: repr(h))
