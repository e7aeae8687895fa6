"""Optional C++ kernels (csrc/), compiled on first use with torch's cpp_extension (cached on disk).

`paged_decode_attention` reads keys and values straight from the block tables, so a decode
step does not copy every request's context; `rope_write_kv`, `silu_and_mul` and
`add_rms_norm_` fuse the elementwise steps of a layer into one pass each;
`apply_token_bitmask_` applies structured outputs' packed token masks in place. If the compiler
or ninja is missing the engine falls back to the torch reference path and says so once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pathlib
import platform
import sys
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("pacer.kernels")

_lock = threading.Lock()
_module: Any = None
_failed = False


def _cpu_tag() -> str:
    """A short name for this CPU's model and instruction-set flags."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
        key = "\n".join(lines) or platform.processor()
    except OSError:
        key = platform.machine() + platform.processor()
    return platform.machine() + "-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@contextlib.contextmanager
def _build_lock(build: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive flock on the build directory while torch builds or loads there.

    torch's own lock is a plain file that a build killed half-way leaves behind, after which
    every later load waits on it forever. The flock dies with its process, so while we hold it
    no other pacer process is inside torch's build here and a leftover torch lock is stale.
    """
    with open(build / ".pacer-build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            (build / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load() -> Any | None:
    """The compiled module, or None when it cannot be built here."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is not None or _failed:
            return _module
        try:
            from torch.utils import cpp_extension

            # ninja may be installed in this environment's bin (pip's `ninja`) without being on PATH
            bin_dir = os.path.dirname(sys.executable)
            if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
                os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")

            csrc = pathlib.Path(__file__).parent / "csrc"
            sources = sorted(str(f) for f in csrc.glob("*.cpp"))
            # torch rebuilds when a source or a flag changes; the headers' hash as a flag
            # makes a header change count too
            headers = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(csrc.glob("*.h")))).hexdigest()[:16]
            build = pathlib.Path(os.environ.get("PACER_CACHE_DIR", pathlib.Path.home() / ".cache" / "pacer"))
            # built with -march=native: one build per CPU kind; and one per checkout, since the
            # build files name the sources by absolute path (two checkouts would rebuild each other's)
            checkout = hashlib.sha256(str(csrc.resolve()).encode()).hexdigest()[:8]
            build = build / "kernels" / f"{_cpu_tag()}-{checkout}"
            build.mkdir(parents=True, exist_ok=True)
            with _build_lock(build):
                _module = cpp_extension.load(
                    name="pacer_kernels", sources=sources, build_directory=str(build),
                    extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math", f"-DPACER_HEADERS={headers}"],
                    extra_ldflags=["-fopenmp", "-lmvec"], verbose=False,
                )
        except Exception as e:  # compiler, ninja or headers missing: use the torch path
            log.warning("pacer C++ kernels unavailable (%s); using the torch attention path", e)
            _failed = True
    return _module
