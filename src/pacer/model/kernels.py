"""Optional C++ kernels (csrc/), compiled on first use with torch's cpp_extension (cached on disk).

`paged_decode_attention` reads keys and values straight from the block tables, so a decode
step does not copy every request's context; `rope_write_kv`, `silu_and_mul` and
`add_rms_norm_` fuse the elementwise steps of a layer into one pass each;
`apply_token_bitmask_` applies structured outputs' packed token masks in place. If the compiler
or ninja is missing the engine falls back to the torch reference path and says so once.

`load_quant()` builds the quantized-linear kernel (csrc_quant/) as its own small module, without
`-march=native`: its ISA variants carry function-level target attributes and are picked at run
time from the CPU's features, so one build runs on AVX2-only and AVX-512 machines alike.
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
_quant_module: Any = None
_quant_failed = False


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


CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math")
LDFLAGS = ("-fopenmp", "-lmvec")
QUANT_CFLAGS = ("-O3", "-fopenmp")   # no -march: the ISA variants are chosen at run time
QUANT_LDFLAGS = ("-fopenmp",)


def _build_dir(csrc: pathlib.Path, cflags: tuple[str, ...] = CFLAGS,
               ldflags: tuple[str, ...] = LDFLAGS) -> tuple[pathlib.Path, dict[str, bytes]]:
    """The build directory for these sources, and the sources (name -> bytes).

    Keyed by what decides the binary: every source's and header's name and content, the compiler
    flags, torch's version and this CPU (the flags say -march=native), so every checkout and venv
    with the same sources shares one build, and a changed header rebuilds. Not keyed by where the
    checkout lies: the build compiles copies staged inside the build directory.
    """
    import torch

    sources = {f.name: f.read_bytes() for f in sorted(csrc.iterdir()) if f.suffix in (".cpp", ".h")}
    h = hashlib.sha256()
    for name, data in sources.items():
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    h.update(" ".join(cflags + ldflags).encode() + b"\0" + torch.__version__.encode())
    root = pathlib.Path(os.environ.get("PACER_CACHE_DIR", pathlib.Path.home() / ".cache" / "pacer"))
    build = root / "kernels" / f"{_cpu_tag()}-{h.hexdigest()[:16]}"
    build.mkdir(parents=True, exist_ok=True)
    return build, sources


def _stage_sources(build: pathlib.Path, sources: dict[str, bytes]) -> None:
    """Copy the sources into `build/src` (under the build lock); an unchanged copy is left alone,
    so torch's own check sees the same files and loads the existing build."""
    staged = build / "src"
    staged.mkdir(exist_ok=True)
    for name, data in sources.items():
        path = staged / name
        if not path.is_file() or path.read_bytes() != data:
            tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)


def _compile(name: str, csrc: pathlib.Path, cflags: tuple[str, ...], ldflags: tuple[str, ...]) -> Any:
    from torch.utils import cpp_extension

    # ninja may be installed in this environment's bin (pip's `ninja`) without being on PATH
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    build, sources = _build_dir(csrc, cflags, ldflags)
    with _build_lock(build):
        _stage_sources(build, sources)
        return cpp_extension.load(
            name=name, sources=[str(build / "src" / n) for n in sorted(sources) if n.endswith(".cpp")],
            build_directory=str(build), extra_cflags=list(cflags), extra_ldflags=list(ldflags), verbose=False,
        )


def load() -> Any | None:
    """The compiled module, or None when it cannot be built here."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is not None or _failed:
            return _module
        try:
            _module = _compile("pacer_kernels", pathlib.Path(__file__).parent / "csrc", CFLAGS, LDFLAGS)
        except Exception as e:  # compiler, ninja or headers missing: use the torch path
            log.warning("pacer C++ kernels unavailable (%s); using the torch attention path", e)
            _failed = True
    return _module


def load_quant() -> Any | None:
    """The quantized-linear module (csrc_quant/), or None when it cannot be built here."""
    global _quant_module, _quant_failed
    if _quant_module is not None or _quant_failed:
        return _quant_module
    with _lock:
        if _quant_module is not None or _quant_failed:
            return _quant_module
        try:
            _quant_module = _compile("pacer_quant", pathlib.Path(__file__).parent / "csrc_quant",
                                     QUANT_CFLAGS, QUANT_LDFLAGS)
        except Exception as e:  # compiler, ninja or headers missing: quantized linears use torch
            log.warning("pacer quantized-linear kernel unavailable (%s); using the torch path", e)
            _quant_failed = True
    return _quant_module
