"""pyproject.toml and environment.yml pin the same packages at the same versions."""

import re
import tomllib

import yaml


def _pyproject_pins(repo):
    data = tomllib.loads((repo / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in data["project"].get("optional-dependencies", {}).values():
        reqs += extra
    pins = {}
    for r in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^;\s]+)", r.strip())
        assert m, f"pyproject.toml: {r!r} is not pinned with =="
        pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def _conda_pins(repo):
    env = yaml.safe_load((repo / "environment.yml").read_text())
    pins = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str) and "=" in dep:
            name, ver = dep.split("=", 1)
            pins[name.lower().replace("_", "-")] = ver
        elif isinstance(dep, dict):  # the pip section: packages conda-forge lacks, pinned ==
            for req in dep.get("pip", []):
                if "==" in req:
                    name, ver = req.split("==", 1)
                    pins[name.strip().lower().replace("_", "-")] = ver.strip()
    return pins


def test_every_pyproject_pin_is_in_environment_yml_at_the_same_version(repo):
    py, conda = _pyproject_pins(repo), _conda_pins(repo)
    missing = sorted(set(py) - set(conda))
    assert not missing, f"environment.yml lacks {missing}"
    differ = {k: (py[k], conda[k]) for k in py if conda[k] != py[k]}
    assert not differ, f"versions differ (pyproject, environment.yml): {differ}"


def test_environment_yml_has_nothing_pyproject_lacks(repo):
    extra = sorted(set(_conda_pins(repo)) - set(_pyproject_pins(repo)) - {"python"})
    assert not extra, f"environment.yml pins packages pyproject.toml does not: {extra}"


def test_workflow_conda_env_uses_the_same_versions(repo):
    env = yaml.safe_load((repo / "workflow" / "envs" / "attnquery.yaml").read_text())
    py = _pyproject_pins(repo)
    for dep in env["dependencies"]:
        name, ver = dep.split("=", 1)
        key = name.lower().replace("_", "-")
        if name != "python":
            assert py.get(key) == ver, f"workflow/envs/attnquery.yaml: {dep}"
    # the rules run the library: its dependencies, not the tests', the docs' or Snakemake
    library = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    runtime = {k for k in py if k not in ("snakemake", "snakemake-executor-plugin-slurm")
               and any(r.split("==")[0].lower().replace("_", "-") == k for r in library)}
    assert {"numpy", "scipy", "pandas"} <= runtime, runtime
    listed = {d.split("=", 1)[0].lower().replace("_", "-") for d in env["dependencies"]}
    assert runtime <= listed, f"missing from the rule environment: {sorted(runtime - listed)}"
