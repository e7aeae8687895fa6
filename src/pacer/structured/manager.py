"""Structured outputs for one engine: grammar compilation (off the step loop, cached by
content, bounded by a timeout), per-request matchers, the step's masks, and the counters.

Thread model. `request()` may be called from any thread (the server's event loop via
`Engine.add_request`): it answers from the cache or queues a compile on a small thread
pool, each thread driving its own worker process (pacer.structured.worker). Everything else
(binding matchers, masks, accepting tokens) runs on the engine's stepping thread. A request
whose grammar is compiling waits in the scheduler's queue as WAITING_FOR_GRAMMAR: it holds
no running slot and no KV blocks, and is admitted once its grammar is ready.
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
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any

from pacer.request import StructuredOutputsParams
from pacer.structured.grammar import GrammarError
from pacer.structured.worker import DEFAULT_COMPILER, CompileTimeout, CompileWorker, WorkerFailed

__all__ = ["StructuredOutputManager", "StructuredStats", "CompiledGrammar", "StructuredOutputError"]

log = logging.getLogger("pacer.structured")


class StructuredOutputError(ValueError):
    """A request's constraint failed to compile (invalid, unsupported, or past the timeout)."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    grammar: str
    prototype: Any   # an llguidance LLMatcher in its start state; requests get deep copies


class StructuredStats:
    """Monotonic counters for /metrics and benchmarks (updated from several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.compilations = 0        # cold compiles started
        self.cache_hits = 0          # requests served from the cache (or a compile in flight)
        self.timeouts = 0
        self.errors = 0              # invalid / unsupported constraints
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


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int], *, timeout: float = 5.0,
                 num_workers: int = 2, compiler: str = DEFAULT_COMPILER, cache_size: int = 256) -> None:
        if not timeout > 0:
            raise ValueError(f"structured_outputs_timeout must be > 0 seconds, got {timeout}")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.timeout = timeout
        self.compiler = compiler
        self.cache_size = cache_size
        self.stats = StructuredStats()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._in_flight: dict[str, Future[CompiledGrammar]] = {}
        self._tmpdir = tempfile.mkdtemp(prefix="pacer-grammar-")
        self._tokenizer_file = os.path.join(self._tmpdir, "tokenizer.json")
        with open(self._tokenizer_file, "w", encoding="utf-8") as f:
            f.write(tokenizer.hf.backend_tokenizer.to_str())
        self._lltok: Any = None
        self._workers: SimpleQueue[CompileWorker] = SimpleQueue()
        self.all_workers = [CompileWorker(self._tokenizer_file, vocab_size, self.eos_token_ids, compiler)
                            for _ in range(num_workers)]
        for w in self.all_workers:
            self._workers.put(w)
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="pacer-grammar")
        for _ in range(num_workers):   # start the processes now, in parallel, off the caller's thread
            self._pool.submit(self._warm_up)
        self.ready = threading.Event()   # set whenever a compile finishes (wakes an idle engine)
        self._matchers: dict[str, Any] = {}
        self._masks: Any = None

    # ------------------------------------------------------------------ compiling (any thread)

    def request(self, params: StructuredOutputsParams) -> Future[CompiledGrammar]:
        """The compiled grammar of `params`, now (cache hit) or later (compiling)."""
        key = params.cache_key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.stats.add("cache_hits")
                done: Future[CompiledGrammar] = Future()
                done.set_result(hit)
                return done
            pending = self._in_flight.get(key)
            if pending is not None:
                self.stats.add("cache_hits")
                return pending
            self.stats.add("compilations")
            future = self._pool.submit(self._compile, key, params.spec())
            self._in_flight[key] = future
        future.add_done_callback(lambda _: self.ready.set())
        return future

    def _warm_up(self) -> None:
        worker = self._workers.get()
        try:
            worker.ensure_started()
        except WorkerFailed as e:
            log.warning("grammar worker did not start (will retry at the first compile): %s", e)
        finally:
            self._workers.put(worker)

    def _compile(self, key: str, spec: dict[str, Any]) -> CompiledGrammar:
        worker = self._workers.get()
        try:
            worker.ensure_started()
        except WorkerFailed as e:
            self._workers.put(worker)
            with self._lock:
                self._in_flight.pop(key, None)
            raise StructuredOutputError(f"the grammar worker failed: {e}") from None
        t0 = time.perf_counter()
        try:
            grammar = worker.compile(spec, self.timeout)
            compiled = CompiledGrammar(grammar, self._new_matcher(grammar))
        except CompileTimeout:
            self.stats.add("timeouts")
            raise StructuredOutputError(f"the grammar did not compile within {self.timeout:g} s "
                                        f"(--structured-outputs-timeout)", timed_out=True) from None
        except GrammarError as e:
            self.stats.add("errors")
            raise StructuredOutputError(str(e)) from None
        except WorkerFailed as e:
            log.error("grammar worker failed: %s", e)
            raise StructuredOutputError(f"the grammar worker failed: {e}") from None
        finally:
            self._workers.put(worker)
            with self._lock:
                self._in_flight.pop(key, None)
        self.stats.add("compile_seconds", time.perf_counter() - t0)
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
            w.kill()
        if self._masks is not None:
            self._masks.close()
        shutil.rmtree(self._tmpdir, ignore_errors=True)
