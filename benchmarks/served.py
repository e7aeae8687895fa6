"""Helpers of the benchmarks that start servers as subprocesses: a free port, and waiting
until one answers."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path

__all__ = ["free_port", "wait_until_up"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout_s: float) -> None:
    """Returns once GET `url`/v1/models answers; raises (killing `proc`) if it exits or does not
    come up within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}); see {log_path}")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)   # a subprocess's start-up, not a test: polling its port is the only signal
    proc.kill()
    raise RuntimeError(f"{proc.args[0]} did not come up in {timeout_s:.0f} s; see {log_path}")
