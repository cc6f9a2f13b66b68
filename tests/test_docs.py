"""The README and the documentation site: their code runs, the site builds, what they cite exists.

Every ```python block of README.md and docs/**/*.md runs as written; ```py blocks are
fragments that say first what they leave out, and compile; shell commands and output are
```sh / ```text / ```json blocks, which do not run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
IDS = [p.relative_to(ROOT).as_posix() for p in PAGES]
LANGUAGES = {"python", "py", "sh", "text", "json"}


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_are_found():
    names = set(IDS)
    assert {"README.md", "docs/index.md", "docs/guides/pytorch.md", "docs/performance.md"} <= names
    assert sum(len(_blocks(p.read_text(encoding="utf-8"), "python")) for p in PAGES) >= 10


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_python_blocks_run(page):
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT).as_posix()
    for block in _blocks(text, "python"):
        if "import torch" in block:
            pytest.importorskip("torch", reason="torch is not installed")
        if "import jax" in block:
            pytest.importorskip("jax", reason="jax is not installed")
        exec(compile(block, name, "exec"), {})


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_fragments_say_what_they_leave_out_and_compile(page):
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT).as_posix()
    for block in _blocks(text, "py"):
        assert block.startswith("# a fragment: "), f"{name}: {block.splitlines()[0]}"
        compile(block, name, "exec")
    other = set(re.findall(r"```(\w+)\n", text)) - LANGUAGES
    assert not other, f"{name}: code blocks of another language: {other}"


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "make probe" in text and "make test" in text
    for section in ("## NumPy", "## PyTorch", "## JAX"):
        start = text.index(section)
        assert "```python\n" in text[start : text.find("\n## ", start + 1)], section
    assert "scatter_max" not in text and "scatter_min" not in text
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 8
    for link in links:
        assert (ROOT / link).is_file(), link


def test_readme_headline_figures_are_in_the_results_it_names():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Headline figures")
    section = text[start : text.index("\n## ", start + 1)]
    table, sources = section.split("Sources:", 1)
    paths = re.findall(r"`(benchmarks/results/[^`]+)`", sources)
    assert len(paths) >= 3
    found = ""
    for path in paths:
        folder = ROOT / path
        found += "".join(f.read_text(encoding="utf-8") for f in sorted(folder.glob("*.md")))
    figures = re.findall(r"(\d[\d,.]*)(?:x| ms| µs)", table)
    assert len(figures) >= 12
    missing = [f for f in figures if f not in found]
    assert not missing, f"README figures not in {paths}: {missing}"


def test_paths_the_pages_cite_exist():
    """A repository path named on a page (results, examples, scripts, tests, sources) exists."""
    path = re.compile(
        r"(?<![\w/.])(?:benchmarks|examples|scripts|tests|src/bitfold)/[\w./-]*[\w/](?![\w$-])"
    )
    cited = {c for page in PAGES for c in path.findall(page.read_text(encoding="utf-8"))}
    assert cited
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert not missing, f"pages cite paths that are not committed: {missing}"


def test_coverage_table_has_every_rule():
    pytest.importorskip("torch", reason="torch is not installed")
    from bitfold.torch import extension_ops, rules

    table = _hooks().exact_mode_coverage()
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    assert len(rows) == len(rules.RULES)
    for rule, row in zip(rules.RULES, rows, strict=True):
        assert row.startswith(f"| `{rule.kind}` |"), (rule.kind, row)
        assert rule.description.replace("|", "\\|") in row, (rule.kind, row)
    assert all(f"`{name}`" in table for name in extension_ops.TRANSLATIONS)
    page = (ROOT / "docs" / "exact-mode-coverage.md").read_text(encoding="utf-8")
    assert "<!-- generated: exact-mode-coverage -->" in page
    # the table exists once: the README and bitfold.torch.mode point to it
    assert "| `scatter_reduce`, `index_reduce`" not in (ROOT / "README.md").read_text("utf-8")


def test_generated_parts_expand():
    hooks = _hooks()
    cli = hooks.expand_markers("<!-- generated: cli-help -->")
    for command in ("probe", "bench", "train", "diff", "digest"):
        assert f"## `bitfold {command}`" in cli and f"usage: bitfold {command}" in cli
    routes = hooks.expand_markers("<!-- generated: host-routes -->")
    from bitfold.backends.host_routes import ROUTES

    assert [r.strip("`") for r in re.findall(r"^\| (`[\w-]+`) \|", routes, re.M)] == list(ROUTES)
    with pytest.raises(ValueError, match="unknown generated part"):
        hooks.expand_markers("<!-- generated: nothing-such -->")


def test_site_builds_strict(tmp_path, monkeypatch, caplog):
    """``mkdocs build --strict``: every link and anchor resolves, the API reference imports.

    Built in this process, as ``mkdocs build`` does it (its ``build_command``): a second
    interpreter would import torch and bitfold again for nothing."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the docs extra)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (the docs extra)")
    pytest.importorskip("material", reason="mkdocs-material is not installed (the docs extra)")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import MkDocsException

    # what the build changes in the process is put back: the hooks put src/ on the path and
    # set OMP_WAIT_POLICY
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    site = tmp_path / "site"
    caplog.set_level("WARNING")
    try:
        config = load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(site))
        assert config.strict
        config.plugins.on_startup(command="build", dirty=False)
        try:
            build(config, dirty=False)
        finally:
            config.plugins.on_shutdown()
    except MkDocsException as err:  # strict: a warning aborts the build
        said = "\n".join(r.getMessage() for r in caplog.records)
        pytest.fail(f"mkdocs build --strict: {err}\n{said[-4000:]}")
    coverage = (site / "exact-mode-coverage" / "index.html").read_text(encoding="utf-8")
    assert "embedding_bag_backward" in coverage and "Untouched" in coverage
