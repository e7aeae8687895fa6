"""The house's import rules, read from every import statement in src/pacer (lazy ones inside
functions and type-only ones under TYPE_CHECKING included, since each is a coupling):

- rooms are ranked bottom up and a room imports only rooms below it (never one beside or above);
- no import cycle between modules, anywhere;
- the pure rooms (what the simulator reuses) import only the standard library and pure rooms.

docs/design/architecture.md draws the same map; change both together.
"""

from __future__ import annotations

import ast
import pathlib
import sys
from collections import defaultdict

import pacer

SRC = pathlib.Path(pacer.__file__).parent

# room -> rank; a room may import only rooms of a strictly lower rank. Rooms of one rank are
# peers that know nothing of each other.
RANKS: dict[str, int] = {
    "errors": -1,                                  # errors: every room may raise them
    "config": 0, "corpus": 0, "clock": 0,          # configuration and plain data
    "structural_tag": 0,                           # a constraint's shape (sampling_params checks it)
    "sampling_params": 1, "request": 2,            # the vocabulary every room speaks
    "kv": 3,                                       # which blocks a request holds
    "sched": 4,                                    # who runs this step
    "perf": 5,                                     # step-time models (engine and simulator)
    "model": 6,                                    # the torch model path
    "structured": 7,                               # grammars and token masks
    "engine": 8,                                   # the step loop
    "llm": 9, "telemetry": 9,                      # the offline API; what pacer emits
    "workload": 10,                                # what a run sends and how it is scored
    "server": 11,                                  # one engine over HTTP
    "deploy": 12,                                  # replicas and routers
    "sim": 13, "bench": 13,                        # the commands, each a package
    "diagnose": 14,
    "tune": 15,
    "cli": 16,
}
# the standard library only, and only these rooms from pacer
PURE = {"errors", "config", "corpus", "clock", "structural_tag", "sampling_params", "request", "kv", "sched", "perf"}
# pure modules inside rooms that are not (the simulator runs them as they are)
PURE_MODULES = {"pacer.deploy.routers", "pacer.deploy.prefix_homes", "pacer.deploy.kv_index",
                "pacer.workload.arrivals", "pacer.workload.report",
                "pacer.workload.equivalence", "pacer.workload.budget", "pacer.workload.text"}


def _module_name(path: pathlib.Path) -> str:
    name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The pacer module an imported name lives in (`pacer.kv.manager.KVCacheManager` -> the module)."""
    while name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(pacer modules imported, top-level third-party or stdlib names imported), every statement."""
    pacer_mods: set[str] = set()
    others: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "pacer":
                others.add(node.module.split(".")[0])
                continue
            for alias in node.names:   # `from pacer.model import kernels` imports the module kernels
                target = _resolve(f"{node.module}.{alias.name}") or _resolve(node.module)
                if target:
                    pacer_mods.add(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pacer":
                    target = _resolve(alias.name)
                    if target:
                        pacer_mods.add(target)
                else:
                    others.add(alias.name.split(".")[0])
    return pacer_mods, others


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""   # "" is the package's own face (pacer/__init__.py)


def test_every_room_has_a_rank():
    rooms = {_room(m) for m in MODULES} - {""}
    assert rooms <= set(RANKS), f"rooms without a rank in RANKS: {sorted(rooms - set(RANKS))}"


def test_rooms_import_only_rooms_below_them():
    bad = []
    for module, (targets, _) in GRAPH.items():
        src = _room(module)
        if not src:
            continue   # pacer/__init__.py re-exports the public API (lazily)
        for target in targets:
            dst = _room(target)
            if dst and dst != src and RANKS[dst] >= RANKS[src]:
                bad.append(f"{module} -> {target} ({src} rank {RANKS[src]} may not import {dst} rank {RANKS[dst]})")
    assert not bad, "imports that climb or cross a layer:\n" + "\n".join(sorted(bad))


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in MODULES:
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root][0])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(GRAPH[w][0]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles (lazy and type-only imports count):\n" + "\n".join(map(str, cycles))


def test_pure_rooms_import_only_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for module, (targets, others) in GRAPH.items():
        if _room(module) not in PURE and module not in PURE_MODULES:
            continue
        bad += [f"{module} imports {name}" for name in sorted(others - allowed)]
        bad += [f"{module} imports {t} (not pure)" for t in sorted(targets)
                if _room(t) not in PURE and t not in PURE_MODULES]
    assert not bad, "\n".join(bad)


def test_the_checks_see_lazy_and_type_only_imports(tmp_path):
    """The reader finds an import inside a function and one under TYPE_CHECKING."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pacer.engine.engine import Engine\n"
                    "def f():\n    import pacer.sim.simulator\n")
    targets, _ = _imports(path)
    assert targets == {"pacer.engine.engine", "pacer.sim.simulator"}


def test_rank_table_matches_the_import_graph():
    """Each room's rank is needed: some import reaches down to every room but the bottom ones."""
    below: dict[str, set[str]] = defaultdict(set)
    for module, (targets, _) in GRAPH.items():
        for target in targets:
            if _room(module) and _room(target) and _room(module) != _room(target):
                below[_room(module)].add(_room(target))
    assert below["engine"] >= {"kv", "sched", "model"}
    assert "sim" not in below["engine"] and "server" not in below["engine"]
