"""The docs stay true to the tree: the README stays a short door with `make run` and `make test`
at the top, the architecture page's rank table is tests/test_layers.py's RANKS, the request
lifecycle's files exist and stay within the size the page states, and every file path and
`pacer.*` module the docs name exists."""

from __future__ import annotations

import ast
import pathlib
import re

from tests.test_layers import RANKS

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "design" / "architecture.md"
PAGES = sorted(DOCS.rglob("*.md")) + [README]

LIFECYCLE_MAX_FILES = 12
LIFECYCLE_MAX_LINES = 2500   # the bound; the page may state a tighter one


def _section(text: str, heading: str) -> str:
    """The body of the `## heading` section, up to the next heading of that level or above."""
    start = text.index(f"\n## {heading}\n") + len(heading) + 5
    end = re.search(r"\n#{1,2} ", text[start:])
    return text[start:start + end.start()] if end else text[start:]


def _table_rows(section: str) -> list[list[str]]:
    """Cells of a Markdown table's numbered rows (`| 3 | ... |`)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if re.match(r"\|\s*-?\d+\s*\|", line)]


def test_readme_is_a_short_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the guide belongs in docs/"
    top = "\n".join(lines[:40])
    assert "make run" in top and "make test" in top, "README's first 40 lines must show `make run` and `make test`"


def test_readme_keeps_the_skip_reasons_conftest_reads():
    """tests/conftest.py reads the `code` bullets of README's "Tests that may skip" section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Tests that may skip", 1)[1].split("\n#", 1)[0]
    assert re.findall(r"^- `([^`]+)`", section, flags=re.MULTILINE)


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_architecture_ranks_equal_the_import_rules():
    rows = _table_rows(_section(ARCHITECTURE.read_text(encoding="utf-8"), "Rooms, bottom up"))
    ranks = {room: int(row[0]) for row in rows for room in re.findall(r"`(\w+)`", row[1])}
    assert ranks == RANKS, "docs/design/architecture.md's room table and tests/test_layers.py's RANKS differ"


def test_lifecycle_files_exist_in_reading_order_within_their_bound():
    section = _section(ARCHITECTURE.read_text(encoding="utf-8"), "The request lifecycle, in reading order")
    rows = _table_rows(section)
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)), "number the files in reading order"
    paths = [re.fullmatch(r"`([^`]+)`", r[1]).group(1) for r in rows]
    assert 1 < len(paths) <= LIFECYCLE_MAX_FILES
    missing = [p for p in paths if not (ROOT / p).is_file()]
    assert not missing, f"the lifecycle names files that do not exist: {missing}"
    stated = int(re.search(r"under ([\d,]+) lines", section).group(1).replace(",", ""))
    assert stated <= LIFECYCLE_MAX_LINES
    total = sum(len((ROOT / p).read_text(encoding="utf-8").splitlines()) for p in paths)
    assert total < stated, f"the lifecycle's {len(paths)} files have {total} lines, over the page's {stated}"


_PATH = re.compile(r"\b((?:src/pacer|tests|benchmarks)/[\w./-]*[\w/])")
_MODULE = re.compile(r"`(pacer(?:\.\w+)+)")


def test_every_path_the_docs_name_exists():
    missing = []
    for page in PAGES:
        for path in set(_PATH.findall(page.read_text(encoding="utf-8"))):
            if not (ROOT / path.rstrip(".")).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(sorted(missing))


def _top_level_names(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(dotted: str) -> bool:
    """`pacer.a.b` is a module, or `pacer.a.b.Name` a name defined or imported at its top level."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT / "src" / pathlib.Path(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            return i == len(parts) or parts[i] in _top_level_names(module)
        if base.is_dir():   # a package without __init__.py: its submodules were tried above
            return i == len(parts)
    return False


def test_every_pacer_module_the_docs_name_exists():
    missing = [f"{page.relative_to(ROOT)}: {name}" for page in PAGES
               for name in sorted(set(_MODULE.findall(page.read_text(encoding="utf-8")))) if not _resolves(name)]
    assert not missing, "modules or names in the docs that pacer does not have:\n" + "\n".join(missing)


def test_the_checks_catch_a_missing_module_and_a_missing_name():
    assert _resolves("pacer.sched.slo_policy") and _resolves("pacer.config.slo.ClassRules")
    assert not _resolves("pacer.sched.no_such_module") and not _resolves("pacer.config.slo.NoSuchName")
