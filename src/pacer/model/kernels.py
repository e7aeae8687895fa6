"""Optional C++ kernels (csrc/), compiled on first use with torch's cpp_extension (cached on disk).

Built per instruction-set level, not for the build machine's CPU (`-march=native`): `avx512`
(AVX-512 F/BW/VL/DQ with AVX2, FMA, F16C: the hand-written 16-lane attention paths), `avx2`
(AVX2, FMA, F16C: the portable code vectorized by the compiler for 8 lanes) and `portable`
(the baseline of the architecture). `load()` takes the best level this CPU runs
(`kernel_isa()`), or the one `PACER_KERNEL_ISA` names; each level is its own module and build
directory, so one cache serves every machine generation and a test can run each level the CPU
supports side by side (`load(isa=...)`).

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
_modules: dict[str, Any] = {}    # ISA level -> the built module (None: it could not be built)
_quant_module: Any = None
_quant_failed = False


def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in info.splitlines() if ln.startswith(("flags", "Features"))), "")
    return frozenset(line.split(":", 1)[-1].split())


def supported_isas() -> list[str]:
    """The ISA levels this CPU runs, best first (`portable` always; the x86 levels on x86 only)."""
    flags = cpu_flags()
    x86 = platform.machine() in ("x86_64", "AMD64", "i686")
    return [name for name, (need, _) in ISA_LEVELS.items()
            if name == "portable" or (x86 and all(f in flags for f in need))]


def kernel_isa() -> str:
    """The level `load()` uses: `PACER_KERNEL_ISA` when set (it must be one this CPU runs),
    else the best this CPU supports."""
    forced = os.environ.get("PACER_KERNEL_ISA")
    supported = supported_isas()
    if forced:
        if forced not in ISA_LEVELS:
            raise ValueError(f"PACER_KERNEL_ISA must be one of {', '.join(ISA_LEVELS)}, got {forced!r}")
        if forced not in supported:
            raise ValueError(f"PACER_KERNEL_ISA={forced}: this CPU runs only {', '.join(supported)}")
        return forced
    return supported[0]


# What stands in for an older CPU on this one: every library's switch to its AVX2 code paths
# (pacer's C++ kernels and quantized linears, oneDNN's linears, ATen's vectorized ops). ATen
# reads its switch at import, so a process must start with it set (`isa_env` for a child).
ISA_FORCING: dict[str, dict[str, str]] = {
    "avx2": {"PACER_KERNEL_ISA": "avx2", "PACER_QUANT_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2"},
}


def isa_env(isa: str | None) -> dict[str, str]:
    """The environment variables that force `isa` (`None` or `native`: none)."""
    if isa in (None, "native"):
        return {}
    if isa not in ISA_FORCING:
        raise ValueError(f"isa must be native or one of {', '.join(ISA_FORCING)}, got {isa!r}")
    return dict(ISA_FORCING[isa])


def forced_isa() -> str | None:
    """The level this process is forced to (every switch of `ISA_FORCING[level]` set), else None."""
    return next((isa for isa, env in ISA_FORCING.items()
                 if all(os.environ.get(k) == v for k, v in env.items())), None)


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


CFLAGS = ("-O3", "-fopenmp", "-ffast-math")
LDFLAGS = ("-fopenmp", "-lmvec")
# ISA level -> (the /proc/cpuinfo flags it needs, the compiler flags it is built with), best first
ISA_LEVELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"),
               ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c")),
    "avx2": (("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),
    "portable": ((), ()),
}
QUANT_CFLAGS = ("-O3", "-fopenmp")   # no -march: the ISA variants are chosen at run time
QUANT_LDFLAGS = ("-fopenmp",)


def _build_dir(csrc: pathlib.Path, cflags: tuple[str, ...] = CFLAGS,
               ldflags: tuple[str, ...] = LDFLAGS) -> tuple[pathlib.Path, dict[str, bytes]]:
    """The build directory for these sources, and the sources (name -> bytes).

    Keyed by what decides the binary: every source's and header's name and content, the compiler
    flags (an ISA level's, never -march=native), torch's version and where it is installed, and the
    architecture, so every checkout sharing a venv and every CPU of that level share one build, and
    a changed header rebuilds. Not keyed by where the checkout lies: the build compiles copies
    staged inside the build directory. Keyed by torch's place because torch's build commands name
    its include and library directories: two venvs sharing one build directory rebuilt it in turn
    (a fresh clone's `make test` and then the main checkout's each recompiled every kernel, ~1 min
    apiece on the 2-core machine), where each now keeps its own.
    """
    import torch

    sources = {f.name: f.read_bytes() for f in sorted(csrc.iterdir()) if f.suffix in (".cpp", ".h")}
    h = hashlib.sha256()
    for name, data in sources.items():
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    h.update(" ".join(cflags + ldflags).encode() + b"\0" + torch.__version__.encode())
    from torch.utils import cpp_extension

    h.update(b"\0" + "\0".join(cpp_extension.include_paths() + cpp_extension.library_paths()).encode())
    root = pathlib.Path(os.environ.get("PACER_CACHE_DIR", pathlib.Path.home() / ".cache" / "pacer"))
    build = root / "kernels" / f"{platform.machine()}-{h.hexdigest()[:16]}"
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


UNITY = "pacer_unity.cpp"


def _compile(name: str, csrc: pathlib.Path, cflags: tuple[str, ...], ldflags: tuple[str, ...],
             unity: bool = False) -> Any:
    """Build `csrc` as one module. `unity`: as one translation unit that includes every source
    (torch's headers, most of each file's compile time, are then parsed once, not once per file)."""
    from torch.utils import cpp_extension

    # ninja may be installed in this environment's bin (pip's `ninja`) without being on PATH
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    build, sources = _build_dir(csrc, cflags + (("-DPACER_UNITY_BUILD",) if unity else ()), ldflags)
    cpps = [n for n in sorted(sources) if n.endswith(".cpp")]
    if unity:
        sources[UNITY] = "".join(f'#include "{n}"\n' for n in cpps).encode()
        cpps = [UNITY]
    with _build_lock(build):
        _stage_sources(build, sources)
        return cpp_extension.load(
            name=name, sources=[str(build / "src" / n) for n in cpps],
            build_directory=str(build), extra_cflags=list(cflags), extra_ldflags=list(ldflags), verbose=False,
        )


def load(isa: str | None = None) -> Any | None:
    """The compiled module for ISA level `isa` (default `kernel_isa()`), or None when it cannot
    be built here. Each level is built once per content and cached; `module.isa` names it."""
    level = isa or kernel_isa()
    if level not in supported_isas():
        raise ValueError(f"kernel ISA {level!r}: this CPU runs only {', '.join(supported_isas())}")
    if level in _modules:
        return _modules[level]
    with _lock:
        if level in _modules:
            return _modules[level]
        module = None
        try:
            module = _compile(f"pacer_kernels_{level}", pathlib.Path(__file__).parent / "csrc",
                              CFLAGS + ISA_LEVELS[level][1], LDFLAGS, unity=True)
            module.isa = level
        except Exception as e:  # compiler, ninja or headers missing: use the torch path
            log.warning("pacer C++ kernels (%s) unavailable (%s); using the torch attention path", level, e)
        _modules[level] = module
    return module


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


def build() -> list[str]:
    """Build, or find built, what this CPU loads by default: the kernels at its ISA level and the
    quantized-linear module (`make` runs this before `run` and `test`, so neither the first
    request nor a test pays the compile). The names of the modules that loaded."""
    built = [] if load() is None else [f"pacer_kernels_{kernel_isa()}"]
    return built + ([] if load_quant() is None else ["pacer_quant"])


if __name__ == "__main__":
    print("pacer kernels:", ", ".join(build()) or "none built (the torch paths)")
