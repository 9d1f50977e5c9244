"""Modules that moved into the folder of their family keep their old import paths
(attnquery._moved): an old path is the new module itself, whichever is imported first."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from attnquery._imports import module_path as _module_path
from attnquery._moved import MOVED

#: names users import from each old path (its public names then)
NAMES = {
    "attnquery.vector_models": ["VectorAttentionLayer", "RotaryFormLayer", "bilinear_layer",
                                "random_vector_layer", "OUTPUTS"],
    "attnquery.rotary_checkpoints": ["write_rotary_checkpoint", "load_rotary_layer",
                                     "load_rotary_head", "PREFIX"],
    "attnquery.learners.vector_served": ["ServedVectorLearner", "STAGES"],
    "attnquery.learners.vector_rotary": ["RotaryVectorLearner", "ATTENTION_TOL", "VERIFY_RTOL"],
    "attnquery.learners.vector_rotary_layer": ["RotaryLayerVectorLearner", "VERIFY_RTOL"],
    "attnquery.learners.rotary_layer": ["RotaryLayerLearner", "fit_rotary_layer",
                                        "rotary_layer_probe_count", "ROTARY_VERIFY_LENGTHS"],
    # the study's machinery, in attnquery.study (every name of each module's __all__ is
    # checked too)
    "attnquery.pipeline": ["run_shard", "aggregate", "render_figure", "validate_study"],
    "attnquery.validate": ["validate_results", "check_table_schema"],
    "attnquery.findings": ["figure_record", "compare_numbers", "publish", "main"],
    "attnquery.appendix": ["write_appendix", "appendix_body", "main"],
    "attnquery.reproducible": ["check_reproducible", "run_study", "main"],
    "attnquery.tables": ["latex_table", "write_table_tex"],
    "attnquery.provenance": ["provenance", "versions", "machine", "_version"],
    "attnquery.bench": ["BENCHMARKS", "run_benchmarks", "main"],
    "attnquery.config": ["load_config", "check_config", "validate_config"],
}


def test_every_old_path_is_listed_and_names_no_file():
    assert set(NAMES) == set(MOVED)
    for old, new in MOVED.items():
        assert _module_path(old) is None, f"{old} is still a file: it would shadow {new}"
        assert _module_path(new) is not None, f"{new} is no module of the package"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new
    assert sys.modules[old] is new and new.__name__ == MOVED[old]
    assert new.__spec__.name == MOVED[old]  # the module keeps its own spec
    parent, _, child = old.rpartition(".")
    assert getattr(importlib.import_module(parent), child) is new  # from parent import child
    for name in set(NAMES[old]) | set(getattr(new, "__all__", ())):
        assert getattr(importlib.import_module(old), name) is getattr(new, name), name


def test_old_paths_imported_first_give_the_same_objects():
    # a fresh interpreter, each old path imported before its new one
    code = (
        "import importlib\n"
        "from attnquery._moved import MOVED\n"
        f"names = {NAMES!r}\n"
        "for old, new in MOVED.items():\n"
        "    o = importlib.import_module(old)\n"
        "    values = {n: getattr(o, n) for n in names[old]}\n"
        "    n = importlib.import_module(new)\n"
        "    assert o is n, old\n"
        "    assert all(getattr(n, k) is v for k, v in values.items()), old\n"
        "print('same')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "same", out.stderr


def test_the_vector_package_keeps_the_old_vector_module_names():
    # attnquery.learners.vector was a module; it is the package's __init__ now
    import attnquery.learners as learners
    from attnquery.learners.vector import OVERSAMPLE, VectorLayerLearner

    assert VectorLayerLearner is learners.VectorLayerLearner
    assert isinstance(OVERSAMPLE, int | float)


def test_an_unknown_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("attnquery.learners.vector_nothing")


@pytest.mark.parametrize("old", ["attnquery.findings", "attnquery.bench"])
def test_python_dash_m_on_an_old_path_runs_the_new_module(old):
    # ``python -m attnquery.findings`` (a command the docs once gave) runs
    # attnquery.study.findings as the main module: its own command line, under its new name
    out = subprocess.run([sys.executable, "-m", old, "--help"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m {MOVED[old]}"), out.stdout


def test_python_dash_m_on_an_old_path_passes_its_arguments_and_exit_status():
    out = subprocess.run([sys.executable, "-m", "attnquery.bench", "no_such_benchmark"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "unknown benchmark 'no_such_benchmark'" in out.stderr


def test_the_study_modules_find_the_repository():
    """The study's modules sit a floor deeper than they did: the paths they build from their
    own location still reach the repository's root (its config and Snakefile)."""
    from attnquery.study.reproducible import REPO

    assert (REPO / "config" / "quick.yaml").is_file() and (REPO / "Snakefile").is_file()
