"""MkDocs hooks: the pages' generated parts, made from the code at build time.

A page asks for a generated part with a marker line, ``<!-- generated: NAME -->``:

* ``exact-mode-coverage``: the table of what ``bitfold.torch.exact_mode()`` and
  ``bitfold.torch.compile`` make exact, one row per rule of
  ``bitfold.torch.rules.RULES`` (and the extension ops of
  ``bitfold.torch.extension_ops.TRANSLATIONS``): the table exists once, in the code;
* ``cli-help``: ``bitfold --help`` and every subcommand's ``--help``, from the parser.

The performance page links its plots where they are committed
(``../benchmarks/results/<run>/<plot>.png``, so the links work on GitHub too); the
site serves those PNGs at the same relative place.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.M)
#: a Sphinx role before inline code in a rendered docstring (":func:`x`" -> "x" as code)
SPHINX_ROLE = re.compile(r":(?:func|meth|mod|class|data|attr|exc|obj):(?=<code>)")
#: a plot of a committed results folder, as the performance page links it
PLOT_LINK = re.compile(r"\]\(\.\./(benchmarks/results/[\w.-]+/[\w.-]+\.png)\)")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _op_names(ops: tuple[Any, ...]) -> str:
    names = []
    for op in ops:
        name = getattr(op, "__name__", None) or str(op)
        name = name.split("::")[-1].split(".")[0]
        if name not in names:
            names.append(name)
    return ", ".join(f"`{n}`" for n in names)


def exact_mode_coverage() -> str:
    """The coverage table, generated from the rules (imports torch)."""
    from bitfold.torch import extension_ops, rules

    lines = [
        "| kind (as counted in `mode.counts`) | ATen ops (with their `_` and `out=` forms) "
        "| what is exact | `bitfold.torch.compile` rewrites it | drop-in without a mode |",
        "|---|---|---|---|---|",
    ]
    for rule in rules.RULES:
        compiled = "yes" if rule.compiled else "no (runs op by op under `exact_mode()`)"
        drop_in = f"`{rule.drop_in}`" if rule.drop_in else "—"
        lines.append(
            f"| `{rule.kind}` | {_op_names(rule.ops)} | {_cell(rule.description)} "
            f"| {compiled} | {drop_in} |"
        )
    namespaces = ", ".join(f"`{n}`" for n in extension_ops.NAMESPACES)
    translated = ", ".join(f"`{n}`" for n in extension_ops.TRANSLATIONS)
    lines += [
        "",
        f"Extension ops, seen by name in the namespaces {namespaces}: {translated} are "
        "translated into the ATen folds above and made exact (counted under the op's name); "
        "their other ops are left to the extension: order-free ones (minima, maxima) and "
        "ops that are no folds untouched, the others listed in `mode.passed` with a reason.",
    ]
    return "\n".join(lines)


def cli_help() -> str:
    """``bitfold --help`` and each subcommand's, as blocks of text."""
    from bitfold.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal's width: fix it
    try:
        parser = build_parser()
        parts = ["## `bitfold`", "", "```text", parser.format_help().rstrip(), "```"]
        sub = next(a for a in parser._actions if a.dest == "command")
        for name, sub_parser in sub.choices.items():
            text = sub_parser.format_help().rstrip()
            parts += ["", f"## `bitfold {name}`", "", "```text", text, "```"]
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def host_routes() -> str:
    """The host's exact routes, in the order they are asked, from their table."""
    from bitfold.backends import host_routes as hr

    def fill(match: re.Match[str]) -> str:
        name, spec = match.group(1), match.group(2) or ""
        value = getattr(hr, name, None)
        return format(value, spec) if isinstance(value, int) else f"*{name}*"

    lines = ["| route | serves |", "|---|---|"]
    for route in hr.TABLE:
        reason = re.sub(r"{(\w+)(?::([^}]*))?}", fill, route.reason)
        lines.append(f"| `{route.name}` | {_cell(reason)} |")
    return "\n".join(lines)


GENERATORS = {
    "exact-mode-coverage": exact_mode_coverage,
    "cli-help": cli_help,
    "host-routes": host_routes,
}


def expand_markers(markdown: str) -> str:
    """``markdown`` with every marker line replaced by its generated part."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated part {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


def _use_src() -> None:
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)


# -- MkDocs events ------------------------------------------------------------------------------


def on_config(config: Any) -> Any:
    _use_src()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return config


def on_files(files: Any, config: Any) -> Any:
    """Serve the plots the pages link in ``benchmarks/results`` beside the pages."""
    from mkdocs.structure.files import File

    docs = Path(config["docs_dir"])
    for page in docs.rglob("*.md"):
        for rel in PLOT_LINK.findall(page.read_text(encoding="utf-8")):
            if files.get_file_from_path(rel) is None and (ROOT / rel).is_file():
                files.append(
                    File(rel, str(ROOT), config["site_dir"], config["use_directory_urls"])
                )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = expand_markers(markdown)
    # a plot linked as ../benchmarks/results/... from a top-level page is served at
    # benchmarks/results/... in the site
    if page.file.src_uri.count("/") == 0:
        markdown = PLOT_LINK.sub(lambda m: f"]({m.group(1)})", markdown)
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings name objects with Sphinx roles; the reference shows the names as code."""
    return SPHINX_ROLE.sub("", html)
