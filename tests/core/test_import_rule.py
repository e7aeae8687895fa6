"""pacer.core (and what it imports from pacer) must use only the standard library."""

import ast
import pathlib
import sys

import pacer

ROOT = pathlib.Path(pacer.__file__).parent
PURE = [*sorted((ROOT / "core").glob("*.py")), ROOT / "request.py", ROOT / "sampling_params.py", ROOT / "config.py",
        ROOT / "clock.py"]


def imported_modules(path: pathlib.Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


def test_core_imports_only_stdlib_and_pure_pacer_modules():
    allowed = set(sys.stdlib_module_names) | {"pacer", "__future__"}
    for path in PURE:
        bad = imported_modules(path) - allowed
        assert not bad, f"{path.name} imports {bad}"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pacer."):
                target = node.module.removeprefix("pacer.")
                assert target.startswith("core") or target in {"request", "sampling_params", "config", "clock"}, (
                    f"{path.name} imports {node.module}, which is not pure"
                )
