"""The command reference in docs/reference/ is what the argument parsers generate
(docs/gen_flags.py), so a flag or a help changed without regenerating fails here."""

from __future__ import annotations

import importlib.util
import pathlib

_GEN = pathlib.Path(__file__).resolve().parent.parent / "docs" / "gen_flags.py"


def _gen_flags():
    spec = importlib.util.spec_from_file_location("gen_flags", _GEN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _gen_flags()


def test_committed_reference_equals_the_parsers():
    wanted = GEN.pages()
    present = {p.name: p.read_text(encoding="utf-8") for p in GEN.REFERENCE.glob("*.md")}
    assert sorted(present) == sorted(wanted), "pages to add or remove: run `python docs/gen_flags.py`"
    stale = [name for name, text in wanted.items() if present[name] != text]
    assert not stale, f"docs/reference out of date for {stale}: run `PYTHONPATH=src python docs/gen_flags.py`"


def test_every_flag_appears_in_its_page():
    pages = GEN.pages()
    for name, parser in GEN.subcommand_parsers().items():
        for action in GEN.documented_actions(parser):
            line = f"- `{GEN._invocation(parser, action)}`: "
            assert line in pages[f"{name}.md"], f"pacer {name}: {line!r} missing from its reference page"
            assert all(flag in line for flag in action.option_strings)


def test_markdown_escaping_keeps_code_and_escapes_the_rest():
    assert GEN._inline("a=512,*=128 `x_y*` [1]") == "a=512,\\*=128 `x_y*` \\[1\\]"
    assert GEN._inline("odd ` tick <b>") == "odd \\` tick &lt;b&gt;"
