"""Structured outputs for one engine: grammar compilation (off the step loop, cached by
content, bounded by a timeout), per-request matchers, the step's masks, and the counters.

Thread model. `request()` may be called from any thread (the server's event loop via
`Engine.add_request`): it answers from the cache or queues a compile on a small thread
pool, each thread driving its own worker process (pacer.structured.worker). Everything else
(binding matchers, masks, accepting tokens) runs on the engine's stepping thread. A request
whose grammar is compiling waits in the scheduler's queue as WAITING_FOR_GRAMMAR: it holds
no running slot and no KV blocks, and is admitted once its grammar is ready.

Nothing a grammar costs lands in a step (issue 27): the worker compiles *and* computes the
first mask under its deadline; the parent rebuilds the prototype and computes its first mask
on the pool thread (deep copies share it), and fails the compile as timed out when that runs
past what is left of the deadline. A request joins a step only once all of that is done.
Each tenant may have `max_compiles_per_tenant` cold compiles in flight (the next is refused
with a clear error); a compile whose requests all went away is cancelled (queued: dropped;
running: its worker killed); failures and timeouts are cached like successes, so the same
bad schema fails at once instead of costing a worker another timeout.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Any

from pacer.errors import FieldError
from pacer.request import StructuredOutputsParams
from pacer.structured.grammar import GrammarError
from pacer.structured.worker import (
    DEFAULT_COMPILER,
    DEFAULT_MEMORY_LIMIT_MB,
    CompileCancelled,
    CompileTimeout,
    CompileWorker,
    WorkerFailed,
)

__all__ = ["StructuredOutputManager", "StructuredStats", "CompiledGrammar", "StructuredOutputError",
           "CompileCapError"]

log = logging.getLogger("pacer.structured")


class StructuredOutputError(ValueError):
    """A request's constraint failed to compile (invalid, unsupported, or past the timeout)."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class CompileCapError(StructuredOutputError, FieldError):
    """The tenant already has its cap of cold compiles in flight (a 400 on `structured_outputs`)."""

    def __init__(self, message: str) -> None:
        StructuredOutputError.__init__(self, message)
        self.field = "structured_outputs"
        self.code = "too_many_compiles"


@dataclass(slots=True)
class _Job:
    """A cold compile in flight: whose it is, how many requests wait on it, its cancel flag."""
    tenant: str
    future: Future[CompiledGrammar]
    refs: int = 1
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    grammar: str
    prototype: Any   # an llguidance LLMatcher in its start state; requests get deep copies
    first_mask: bytes = b""   # its start state's packed mask, computed at compile time (off any step)


class StructuredStats:
    """Monotonic counters for /metrics and benchmarks (updated from several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.compilations = 0        # cold compiles started
        self.cache_hits = 0          # requests served from the cache (or a compile in flight)
        self.timeouts = 0
        self.errors = 0              # invalid / unsupported constraints
        self.negative_hits = 0       # requests failed at once from the cache of failures
        self.cancelled = 0           # compiles dropped or killed: every request left
        self.tenant_refusals = 0     # compiles refused: the tenant had its cap in flight
        self.compile_seconds = 0.0   # wall time of finished compiles
        self.mask_compute_seconds = 0.0   # mask thread busy time
        self.mask_wait_seconds = 0.0      # time steps waited for masks after their forward
        self.mask_rows = 0

    def add(self, name: str, value: float = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + value)

    def add_mask_compute(self, seconds: float, rows: int) -> None:
        with self._lock:
            self.mask_compute_seconds += seconds
            self.mask_rows += rows

    def add_mask_wait(self, seconds: float) -> None:
        self.add("mask_wait_seconds", seconds)

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


COMPILE_NICENESS = 10   # compiles yield the CPU to the engine's steps (the worker process too)


def _lower_priority() -> None:
    """Run this pool thread at a lower CPU priority (Linux: per thread): on a few cores a
    grammar's matcher rebuild would otherwise take the step's core."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)
    except (OSError, AttributeError):
        pass


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int], *, timeout: float = 5.0,
                 num_workers: int = 2, compiler: str = DEFAULT_COMPILER, cache_size: int = 256,
                 max_compiles_per_tenant: int = 4, memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB) -> None:
        if not timeout > 0:
            raise ValueError(f"structured_outputs_timeout must be > 0 seconds, got {timeout}")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.timeout = timeout
        self.compiler = compiler
        self.cache_size = cache_size
        self.max_compiles_per_tenant = max_compiles_per_tenant
        self.stats = StructuredStats()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._failed: OrderedDict[str, StructuredOutputError] = OrderedDict()   # the negative cache
        self._in_flight: dict[str, _Job] = {}
        self._tmpdir = tempfile.mkdtemp(prefix="pacer-grammar-")
        self._tokenizer_file = os.path.join(self._tmpdir, "tokenizer.json")
        with open(self._tokenizer_file, "w", encoding="utf-8") as f:
            f.write(tokenizer.hf.backend_tokenizer.to_str())
        self._lltok: Any = None
        self._workers: SimpleQueue[CompileWorker] = SimpleQueue()
        self.all_workers = [CompileWorker(self._tokenizer_file, vocab_size, self.eos_token_ids, compiler,
                                          memory_limit_mb=memory_limit_mb)
                            for _ in range(num_workers)]
        for w in self.all_workers:
            self._workers.put(w)
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="pacer-grammar", initializer=_lower_priority)
        for _ in range(num_workers):   # start the processes now, in parallel, off the caller's thread
            self._pool.submit(self._warm_up)
        self.ready = threading.Event()   # set whenever a compile finishes (wakes an idle engine)
        self._matchers: dict[str, Any] = {}
        self._masks: Any = None

    # ------------------------------------------------------------------ compiling (any thread)

    def request(self, params: StructuredOutputsParams, tenant: str = "default") -> Future[CompiledGrammar]:
        """The compiled grammar of `params`, now (cache hit, or a cached failure) or later
        (compiling). Raises StructuredOutputError when `tenant` already has
        `max_compiles_per_tenant` cold compiles in flight."""
        key = params.cache_key()
        done: Future[CompiledGrammar] = Future()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.stats.add("cache_hits")
                done.set_result(hit)
                return done
            failed = self._failed.get(key)
            if failed is not None:
                self.stats.add("negative_hits")
                done.set_exception(StructuredOutputError(str(failed), failed.timed_out))
                return done
            job = self._in_flight.get(key)
            if job is not None:
                self.stats.add("cache_hits")
                job.refs += 1
                return job.future
            mine = sum(1 for j in self._in_flight.values() if j.tenant == tenant)
            if mine >= self.max_compiles_per_tenant:
                self.stats.add("tenant_refusals")
                raise CompileCapError(
                    f"structured_outputs: tenant {tenant!r} already has {mine} grammar compiles in flight "
                    f"(limit {self.max_compiles_per_tenant}); retry when they finish")
            self.stats.add("compilations")
            job = _Job(tenant, Future())
            job.future = self._pool.submit(self._compile, key, params.spec(), job)
            self._in_flight[key] = job
        job.future.add_done_callback(lambda _: self.ready.set())
        return job.future

    def drop(self, future: Future[CompiledGrammar]) -> None:
        """A request waiting on `future` went away (aborted, shed, finished): when it was the
        last, the compile is cancelled (still queued: never runs; running: its worker is killed)."""
        with self._lock:
            for key, job in self._in_flight.items():
                if job.future is future:
                    job.refs -= 1
                    if job.refs > 0:
                        return
                    del self._in_flight[key]
                    break
            else:
                return
        self.stats.add("cancelled")
        job.cancel.set()
        future.cancel()

    def _warm_up(self) -> None:
        worker = self._workers.get()
        try:
            worker.ensure_started()
        except WorkerFailed as e:
            log.warning("grammar worker did not start (will retry at the first compile): %s", e)
        finally:
            self._workers.put(worker)

    def _compile(self, key: str, spec: dict[str, Any], job: _Job) -> CompiledGrammar:
        if job.cancel.is_set():
            raise StructuredOutputError("cancelled: every request waiting on this grammar went away")
        worker = self._workers.get()
        try:
            return self._compile_on(worker, key, spec, job)
        except StructuredOutputError as e:
            if not job.cancel.is_set() and "worker failed" not in str(e):
                with self._lock:   # the negative cache: the same spec fails at once next time
                    self._failed[key] = e
                    while len(self._failed) > self.cache_size:
                        self._failed.popitem(last=False)
            raise
        finally:
            self._workers.put(worker)
            with self._lock:
                if self._in_flight.get(key) is job:
                    del self._in_flight[key]

    def _compile_on(self, worker: CompileWorker, key: str, spec: dict[str, Any], job: _Job) -> CompiledGrammar:
        try:
            worker.ensure_started()
        except WorkerFailed as e:
            raise StructuredOutputError(f"the grammar worker failed: {e}") from None
        t0 = time.perf_counter()
        timed_out = StructuredOutputError(f"the grammar did not compile within {self.timeout:g} s "
                                          f"(--structured-outputs-timeout)", timed_out=True)
        try:
            grammar = worker.compile(spec, self.timeout, job.cancel)
            prototype = self._new_matcher(grammar)
            first_mask = bytes(prototype.compute_bitmask())   # the expensive first mask: here, not in a step
        except CompileTimeout:
            self.stats.add("timeouts")
            raise timed_out from None
        except CompileCancelled:
            raise StructuredOutputError("cancelled: every request waiting on this grammar went away") from None
        except GrammarError as e:
            self.stats.add("errors")
            raise StructuredOutputError(str(e)) from None
        except WorkerFailed as e:
            log.error("grammar worker failed: %s", e)
            raise StructuredOutputError(f"the grammar worker failed: {e}") from None
        took = time.perf_counter() - t0
        if took > self.timeout:   # the worker made it in time, the parent's rebuild did not
            self.stats.add("timeouts")
            raise timed_out
        self.stats.add("compile_seconds", took)
        compiled = CompiledGrammar(grammar, prototype, first_mask)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _new_matcher(self, grammar: str) -> Any:
        import llguidance as llg

        with self._lock:
            if self._lltok is None:
                with open(self._tokenizer_file, encoding="utf-8") as f:
                    self._lltok = llg.LLTokenizer(f.read(), n_vocab=self.vocab_size,
                                                  eos_token=self.eos_token_ids or None)
        matcher = llg.LLMatcher(self._lltok, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return matcher

    # ------------------------------------------------------------------ matchers (engine thread)

    def bind(self, request_id: str, compiled: CompiledGrammar) -> None:
        self._matchers[request_id] = compiled.prototype.deep_copy()

    def release(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def is_constrained(self, request_id: str) -> bool:
        return request_id in self._matchers

    @property
    def num_constrained(self) -> int:
        return len(self._matchers)

    def start_masks(self, sampling_ids: Iterable[str]) -> Any:
        """Begin the masks of the constrained requests among `sampling_ids` (those that
        sample this step); None when there are none, so unconstrained steps pay nothing."""
        items = [(rid, self._matchers[rid]) for rid in sampling_ids if rid in self._matchers]
        if not items:
            return None
        if self._masks is None:
            from pacer.structured.masks import MaskComputer

            self._masks = MaskComputer(self.vocab_size, self.stats)
        return self._masks.start(items)

    def accept(self, request_id: str, token_id: int) -> bool:
        """Advance the request's matcher by its sampled token; True when the grammar is
        complete (the request should stop). A token the grammar refuses (an executor that
        does not apply masks) raises StructuredOutputError."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return False
        if token_id in self.eos_token_ids and matcher.is_accepting():
            return True
        if not matcher.consume_token(token_id):
            raise StructuredOutputError(f"token {token_id} violates the grammar: {matcher.get_error()}")
        return bool(matcher.is_stopped())

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for w in self.all_workers:
            w.close()   # before the tokenizer file goes: a warm-up may be starting one
        if self._masks is not None:
            self._masks.close()
        shutil.rmtree(self._tmpdir, ignore_errors=True)
