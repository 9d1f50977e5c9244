"""Configuration validation: every bad value stops the run with a message naming the key."""

import subprocess
import sys

import pytest
import yaml

from attnquery.errors import ConfigError
from attnquery.study.config import load_config


def _write(tmp_path, cfg):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _quick(repo):
    return yaml.safe_load((repo / "config" / "quick.yaml").read_text())


@pytest.mark.parametrize("name", ["config.yaml", "quick.yaml", "paper.yaml"])
def test_shipped_configs_are_valid(repo, name):
    cfg = load_config(repo / "config" / name)
    assert cfg["experiments"]


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda c: c.update(colour="red"), "Additional properties.*colour"),
        (lambda c: c["experiments"]["exact"].update(dd=[2]), "experiments.exact.*dd"),
        (lambda c: c["experiments"]["exact"].update(d="eight"), "experiments.exact.d"),
        (lambda c: c["experiments"]["exact"].update(d=[0, 4]), r"experiments.exact.d.0"),
        (lambda c: c["experiments"]["exact"].update(d=[]), "experiments.exact.d"),
        (lambda c: c["experiments"]["exact"].update(probes=["sobol"]), "sobol"),
        (lambda c: c["experiments"]["exact"].update(seeds=0), "experiments.exact.seeds"),
        (lambda c: c.update(seed=-1), "seed"),
        (lambda c: c.update(cell_time_limit_s=0), "cell_time_limit_s"),
        (lambda c: c["experiments"].update(nonsense={}), "nonsense"),
        (lambda c: c["experiments"]["lowrank_scale"].update(rank=[300]),
         "experiments.lowrank_scale.*rank"),
        (lambda c: c["experiments"]["lowrank_phase"].update(rank=[9]),
         "experiments.lowrank_phase.*rank"),
        (lambda c: c["experiments"]["rounding"].update(rank=20), "experiments.rounding.rank"),
        (lambda c: c["experiments"]["noise"].update(tau=[0.0]), "experiments.noise.tau"),
        (lambda c: c["experiments"]["noise"].update(tau=[-1.0]), "experiments.noise.tau"),
        (lambda c: c["experiments"]["noise"].update(mu=[1.5]), "experiments.noise.mu"),
        (lambda c: c["experiments"]["membership"].update(mu=0.0), "experiments.membership.mu"),
        (lambda c: c["experiments"]["noise"].update(d=[0]), "experiments.noise.d"),
    ],
)
def test_bad_values_are_named(repo, tmp_path, mutate, match):
    cfg = _quick(repo)
    mutate(cfg)
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path, cfg))


def test_no_enabled_experiment(repo, tmp_path):
    cfg = _quick(repo)
    for sec in cfg["experiments"].values():
        sec["enabled"] = False
    with pytest.raises(ConfigError, match="no experiment is enabled"):
        load_config(_write(tmp_path, cfg))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_snakemake_stops_before_any_job_on_a_bad_config(repo, tmp_path):
    cfg = _quick(repo)
    cfg["experiments"]["exact"]["d"] = [0]
    p = _write(tmp_path, cfg)
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--cores", "1",
         "--configfile", str(p), "--directory", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "d" in text and "minimum" in text
    assert not (tmp_path / "run" / "results").exists()


def test_malformed_yaml_is_a_config_error(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("seed: 1\nexperiments: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml is not valid YAML \(line \d+"):
        load_config(p)
