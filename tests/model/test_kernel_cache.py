"""Where the C++ kernels are built: one build per content, shared by every checkout."""

import shutil
from pathlib import Path

import pytest

from pacer.model import kernels

CSRC = Path(kernels.__file__).parent / "csrc"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _checkout(root: Path, name: str) -> Path:
    csrc = root / name / "csrc"
    shutil.copytree(CSRC, csrc)
    return csrc


def test_two_checkouts_of_the_same_sources_share_one_build(cache):
    a, _ = kernels._build_dir(_checkout(cache, "one"))
    b, _ = kernels._build_dir(_checkout(cache, "two"))
    assert a == b
    assert str(cache / "cache" / "kernels") in str(a)


def test_a_changed_header_or_source_gets_a_build_of_its_own(cache):
    base, _ = kernels._build_dir(_checkout(cache, "one"))
    header = _checkout(cache, "header")
    (header / "simd.h").write_text((header / "simd.h").read_text() + "\n// changed\n")
    source = _checkout(cache, "source")
    (source / "fused_ops.cpp").write_text((source / "fused_ops.cpp").read_text() + "\n// changed\n")
    dirs = {base, kernels._build_dir(header)[0], kernels._build_dir(source)[0]}
    assert len(dirs) == 3


def test_staged_sources_are_the_checkouts_and_an_unchanged_copy_is_not_rewritten(cache):
    build, sources = kernels._build_dir(_checkout(cache, "one"))
    kernels._stage_sources(build, sources)
    staged = {p.name: p.read_bytes() for p in (build / "src").iterdir()}
    assert staged == sources
    mtimes = {p.name: p.stat().st_mtime_ns for p in (build / "src").iterdir()}
    kernels._stage_sources(build, kernels._build_dir(_checkout(cache, "two"))[1])
    assert {p.name: p.stat().st_mtime_ns for p in (build / "src").iterdir()} == mtimes


def test_the_kernel_isa_is_the_cpus_best_unless_forced(monkeypatch):
    """One build per ISA level, chosen at run time from the CPU's flags (never -march=native):
    an AVX2-only CPU gets `avx2`, a CPU without AVX2 the portable build, and PACER_KERNEL_ISA
    forces a level the CPU runs (anything else is refused by name)."""
    import platform

    monkeypatch.delenv("PACER_KERNEL_ISA", raising=False)
    assert kernels.kernel_isa() == kernels.supported_isas()[0]
    assert all("-march" not in " ".join(flags) for _, flags in kernels.ISA_LEVELS.values())
    monkeypatch.setenv("PACER_KERNEL_ISA", "portable")
    assert kernels.kernel_isa() == "portable"
    monkeypatch.setenv("PACER_KERNEL_ISA", "sse9")
    with pytest.raises(ValueError, match="must be one of avx512, avx2, portable"):
        kernels.kernel_isa()
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"sse2", "avx", "avx2", "fma", "f16c"}))
    monkeypatch.setenv("PACER_KERNEL_ISA", "avx512")
    with pytest.raises(ValueError, match="this CPU runs only avx2, portable"):
        kernels.kernel_isa()
    monkeypatch.delenv("PACER_KERNEL_ISA")
    assert kernels.kernel_isa() == "avx2"
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert kernels.kernel_isa() == "portable"
    with pytest.raises(ValueError, match="this CPU runs only portable"):
        kernels.load("avx2")


def test_forcing_avx2_holds_every_library_and_is_recognised_only_when_whole(monkeypatch):
    """`isa_env("avx2")` names the switch of each library (pacer's kernels and quantized linears,
    oneDNN, ATen); `forced_isa()` reports the level only when all of them are set, so a half-forced
    process is not labelled AVX2 in a benchmark's header or a calibration's key."""
    env = kernels.isa_env("avx2")
    assert set(env) == {"PACER_KERNEL_ISA", "PACER_QUANT_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"}
    assert kernels.isa_env("native") == kernels.isa_env(None) == {}
    with pytest.raises(ValueError, match="isa must be native or one of avx2"):
        kernels.isa_env("avx9")
    for k in env:
        monkeypatch.delenv(k, raising=False)
    assert kernels.forced_isa() is None
    for i, (k, v) in enumerate(env.items()):
        monkeypatch.setenv(k, v)
        assert kernels.forced_isa() == ("avx2" if i == len(env) - 1 else None)
