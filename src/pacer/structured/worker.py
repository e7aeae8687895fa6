"""The grammar worker: a child process that compiles constraint specs, and its client.

Compilation runs here, not on the engine's thread, so a slow or pathological grammar costs
one worker and its own request, never a step. The protocol is one JSON line per message on
stdin / stdout: the client sends `{"id", "spec"}`, the worker answers `{"id", "grammar"}` or
`{"id", "error"}`. A compile past its deadline is ended by killing the process (a thread
cannot be stopped; a process can), and the next compile starts a fresh one; so is a compile
whose requests all went away (`cancel`, an orphan). The worker's address space is capped
(RLIMIT_AS, `--memory-limit-mb`): a schema that would eat the host's memory fails alone. The worker
imports llguidance and the compile function only (no torch), so it starts in well under a
second.

Run as `python -m pacer.structured.worker --tokenizer FILE --n-vocab N --eos IDS
[--compiler MODULE:FUNCTION]`; `--compiler` swaps in another `f(spec, tokenizer) -> grammar`
(tests inject a slow one).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

__all__ = ["CompileWorker", "CompileTimeout", "CompileCancelled", "WorkerFailed", "DEFAULT_COMPILER",
           "DEFAULT_MEMORY_LIMIT_MB", "main"]

DEFAULT_COMPILER = "pacer.structured.grammar:compile_spec"
DEFAULT_MEMORY_LIMIT_MB = 4096   # the worker's address space (RLIMIT_AS); llguidance + Python use ~0.5 GB
_POLL_S = 0.05                   # how often a waiting compile looks at its cancel flag


class CompileTimeout(TimeoutError):
    """The compile ran past its deadline; the worker was killed."""


class CompileCancelled(RuntimeError):
    """Every request waiting on the compile went away; the worker was killed."""


class WorkerFailed(RuntimeError):
    """The worker process died or spoke nonsense (not the grammar's fault)."""


class CompileWorker:
    """One worker process, used by one thread at a time (the manager gives each worker its
    own thread). Started lazily; restarted after a kill or a crash, never after `close` (a
    start racing the manager's close would spawn a process after its tokenizer file is gone)."""

    def __init__(self, tokenizer_file: str, n_vocab: int, eos_token_ids: Sequence[int],
                 compiler: str = DEFAULT_COMPILER, startup_timeout: float = 120.0,
                 memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB) -> None:
        self.argv = [sys.executable, "-m", "pacer.structured.worker", "--tokenizer", tokenizer_file,
                     "--n-vocab", str(n_vocab), "--eos", ",".join(map(str, eos_token_ids)), "--compiler", compiler,
                     "--memory-limit-mb", str(memory_limit_mb)]
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed = False
        self._lock = threading.Lock()   # a start and a kill or close from other threads
        self.num_starts = 0
        self._next_id = 0

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)   # the parent's import path
        with self._lock:
            if self.closed:
                raise WorkerFailed("the grammar worker is closed")
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            self.proc = proc
            self.num_starts += 1
        ready = self._read(proc, time.monotonic() + self.startup_timeout)
        if ready is None or not ready.get("ready"):
            self.kill()
            raise WorkerFailed(f"the grammar worker did not start: {ready!r}")
        return proc

    def ensure_started(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._start()

    def compile(self, spec: dict[str, Any], timeout: float, cancel: Any = None) -> str:
        """The checked grammar of `spec`. Raises GrammarError (bad spec), CompileTimeout
        (past `timeout` seconds; the process is killed), CompileCancelled (`cancel`, a
        threading.Event, was set while it ran; the process is killed) or WorkerFailed."""
        from pacer.structured.grammar import GrammarError

        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        self._next_id += 1
        job_id = self._next_id
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps({"id": job_id, "spec": spec}).encode() + b"\n")
            proc.stdin.flush()
        except OSError as e:
            self.kill()
            raise WorkerFailed(f"the grammar worker went away: {e}") from None
        reply = self._read(proc, time.monotonic() + timeout, cancel)
        if reply is None and cancel is not None and cancel.is_set():
            self.kill()
            raise CompileCancelled("every request waiting on this compile went away")
        if reply is None:
            self.kill()
            raise CompileTimeout(f"compiling took longer than {timeout:g} s")
        if reply.get("id") != job_id:
            self.kill()
            raise WorkerFailed(f"the grammar worker answered out of turn: {reply!r}")
        if "error" in reply:
            raise GrammarError(str(reply["error"]))
        return str(reply["grammar"])

    def _read(self, proc: subprocess.Popen[bytes], deadline: float, cancel: Any = None) -> dict[str, Any] | None:
        """The next JSON line from the worker, or None at the deadline (or once `cancel` is set)."""
        out = proc.stdout
        assert out is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                return None
            readable, _, _ = select.select([out], [], [], left if cancel is None else min(left, _POLL_S))
            if readable:
                break
        line = out.readline()
        if not line:
            self.kill()
            raise WorkerFailed(f"the grammar worker exited (code {proc.poll()})")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self.kill()
            raise WorkerFailed(f"the grammar worker wrote {line[:200]!r}") from None
        return reply if isinstance(reply, dict) else {"bad": reply}

    def kill(self) -> None:
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        """Kill the process, and start none again."""
        with self._lock:
            self.closed = True
        self.kill()


def _load_compiler(name: str) -> Callable[[dict[str, Any], Any], str]:
    module, _, func = name.partition(":")
    if not module or not func:
        raise SystemExit(f"--compiler must be MODULE:FUNCTION, got {name!r}")
    fn: Callable[[dict[str, Any], Any], str] = getattr(importlib.import_module(module), func)
    return fn


def _serve(compile_fn: Callable[[dict[str, Any], Any], str], tokenizer: Any, stdin: IO[bytes],
           stdout: IO[bytes]) -> None:
    from pacer.structured.grammar import GrammarError

    def send(obj: dict[str, Any]) -> None:
        stdout.write(json.dumps(obj).encode() + b"\n")
        stdout.flush()

    send({"ready": True})
    for line in stdin:
        job = json.loads(line)
        try:
            send({"id": job["id"], "grammar": compile_fn(job["spec"], tokenizer)})
        except GrammarError as e:
            send({"id": job["id"], "error": str(e)})
        except Exception as e:   # a compiler bug is still this spec's failure, not the worker's
            send({"id": job["id"], "error": f"{type(e).__name__}: {e}"})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pacer.structured.worker")
    p.add_argument("--tokenizer", required=True, help="HF tokenizer.json file")
    p.add_argument("--n-vocab", type=int, required=True)
    p.add_argument("--eos", default="", help="comma-separated EOS token ids")
    p.add_argument("--compiler", default=DEFAULT_COMPILER)
    p.add_argument("--memory-limit-mb", type=int, default=DEFAULT_MEMORY_LIMIT_MB,
                   help="cap on this process's address space (RLIMIT_AS); 0: none")
    args = p.parse_args(argv)
    try:
        os.nice(10)   # compiles yield the CPU to the engine's steps
    except OSError:
        pass
    if args.memory_limit_mb > 0:
        import resource

        limit = args.memory_limit_mb << 20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    import llguidance as llg

    with open(args.tokenizer, encoding="utf-8") as f:
        eos = [int(t) for t in args.eos.split(",") if t]
        tokenizer = llg.LLTokenizer(f.read(), n_vocab=args.n_vocab, eos_token=eos or None)
    _serve(_load_compiler(args.compiler), tokenizer, sys.stdin.buffer, sys.stdout.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
