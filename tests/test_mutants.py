"""``make mutants`` cannot drift: every mutation still finds its text, a stale one fails the
run, and two of them are killed end to end (the whole table: ``make mutants``, minutes).

The end-to-end runs mutate a copy of ``src/bitfold`` (scripts/mutants.py), never the
checkout: one mutation of the torch handlers (a few seconds) and one of the compiled
kernels (every kernel compiled again from the copy). Each is run twice: mutated, its tests
must fail; with the mutation's text left as it is, the same tests must pass, so that the
failure is the mutation's and not the copy's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_mutants():
    spec = importlib.util.spec_from_file_location("bitfold_mutants", ROOT / "scripts/mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses read their module while the class is made
    spec.loader.exec_module(module)
    return module


mutants = _load_mutants()


@pytest.mark.parametrize("mutation", mutants.MUTATIONS, ids=lambda m: m.name)
def test_every_mutation_finds_its_text_exactly_once_and_names_existing_tests(mutation):
    text = (mutants.SRC / mutation.path).read_text()
    assert text.count(mutation.old) == 1, (
        f"stale mutation {mutation.name!r}: its text occurs {text.count(mutation.old)} times in "
        f"src/bitfold/{mutation.path}; mutate the code that does that job now"
    )
    assert mutation.new != mutation.old
    files = [a.split("::")[0] for a in mutation.tests if a.startswith("tests/")]
    assert files and all((ROOT / f).is_file() for f in files), mutation.tests


def test_a_stale_mutation_fails_make_mutants(monkeypatch, capsys):
    stale = dataclasses.replace(mutants.MUTATIONS[0], name="gone", old="text that is not there\n")
    result = mutants.run(stale, timeout=60)
    assert result["outcome"] == "stale" and "occurs 0 times" in result["detail"]
    monkeypatch.setattr(mutants, "MUTATIONS", (stale,))
    assert mutants.main([]) == 1
    assert "FAILED, stale (its text is gone from the code: update the mutation): gone" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "name",
    [
        "mode: put returns ATen's inexact sum (still counted)",  # about 6 s a run
        "CPU limbs: no carry normalisation between chunks",  # 7-10 s a run, compiling included
    ],
)
def test_a_quick_mutation_is_killed_and_its_tests_pass_without_it(name):
    (mutation,) = [m for m in mutants.MUTATIONS if m.name == name]
    killed = mutants.run(mutation, timeout=600)
    assert killed["outcome"] == "killed", killed
    unmutated = dataclasses.replace(mutation, new=mutation.old)
    assert mutants.run(unmutated, timeout=600)["outcome"] == "survived"
