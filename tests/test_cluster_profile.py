"""The SLURM workflow profile (profiles/slurm), checked without a SLURM installation.

The full test (`make cluster-test`, tests/cluster/run_cluster_test.sh) runs config/quick.yaml on
a real one-node SLURM cluster. These tests are its light form, for CI: the profile is linted
against Snakemake's own command-line parser, and a tiny study is run through the real SLURM
executor plugin with stand-ins for the SLURM commands (sbatch runs the job at once, squeue reports
its state), which checks which rules are submitted, with which sbatch options, and that the
aggregation, merging and plotting rules run locally.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
SLURM_CONF_TEMPLATE = REPO / "tests" / "cluster" / "slurm.conf.in"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")

REQUIRED_DEFAULT_RESOURCES = ("slurm_partition", "runtime", "mem_mb", "cpus_per_task")


@pytest.fixture(scope="module")
def profile() -> dict:
    return yaml.safe_load(PROFILE.read_text())


def profile_arguments(profile: dict) -> list[str]:
    """The profile as the command-line arguments Snakemake derives from it."""
    args = []
    for key, value in profile.items():
        if value is True:
            args.append(f"--{key}")
        elif value is False:
            continue
        elif isinstance(value, dict):
            args += [f"--{key}", *(f"{k}={v}" for k, v in value.items())]
        else:
            args += [f"--{key}", str(value)]
    return args


def test_profile_uses_slurm_with_default_resources(profile):
    assert profile["executor"] == "slurm"
    resources = profile["default-resources"]
    missing = [r for r in REQUIRED_DEFAULT_RESOURCES if r not in resources]
    assert not missing, f"default-resources lacks {missing}"
    assert isinstance(resources["runtime"], int) and resources["runtime"] > 0
    assert isinstance(resources["mem_mb"], int) and resources["mem_mb"] > 0
    assert isinstance(resources["cpus_per_task"], int) and resources["cpus_per_task"] >= 1
    assert re.fullmatch(r"[A-Za-z0-9_-]+", str(resources["slurm_partition"]))


def test_profile_keys_are_options_snakemake_accepts(profile):
    """Every key is a command-line option of Snakemake or of the SLURM executor plugin."""
    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()
    args = profile_arguments(profile)
    try:
        parsed = parser.parse_args(args)
    except SystemExit as exc:  # argparse reports an unknown option or a bad value and exits
        pytest.fail(f"Snakemake rejects the profile's options {args}: exit {exc.code}")
    assert parsed.executor == "slurm"


def test_every_profile_key_is_commented():
    """Each key (default resources included) has a comment on the line(s) just above it."""
    lines = PROFILE.read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        match = re.match(r"^\s*([A-Za-z_][\w-]*):", line)
        if not match:
            continue
        above = lines[i - 1].strip() if i > 0 else ""
        if not above.startswith("#") and "#" not in line:
            undocumented.append(match.group(1))
    assert not undocumented, f"keys without a comment in {PROFILE.name}: {undocumented}"


def test_status_polling_works_without_accounting_database(profile):
    """squeue is used, and the test cluster keeps finished jobs long enough for it.

    The plugin falls back to sacct (which cannot report jobs without slurmdbd) unless MinJobAge
    is at least three times the delay before the first status check.
    """
    assert profile["slurm-status-command"] == "squeue"
    init_s = profile["slurm-init-seconds-before-status-checks"]
    assert isinstance(init_s, int) and init_s >= 1
    min_job_age = int(re.search(r"^MinJobAge=(\d+)$", SLURM_CONF_TEMPLATE.read_text(), re.M)[1])
    assert min_job_age >= 3 * init_s


def test_test_cluster_partition_is_the_profile_partition(profile):
    """run_cluster_test.sh names the test cluster's partition after the profile's default."""
    script = (REPO / "tests" / "cluster" / "run_cluster_test.sh").read_text()
    assert "slurm_partition" in script and "ATTNQ_SLURM_PARTITION" in script
    up = (REPO / "tests" / "cluster" / "slurm_up.sh").read_text()
    assert 'PARTITION="${ATTNQ_SLURM_PARTITION:-batch}"' in up
    assert profile["default-resources"]["slurm_partition"] == "batch"


# Stand-ins for the SLURM commands the executor plugin calls. sbatch starts the wrapped command
# in the background (as SLURM would, on a node) and records its arguments; squeue reports
# RUNNING until the command has exited, then COMPLETED or FAILED.
FAKE_SBATCH = """\
import argparse, json, os, subprocess, sys
from pathlib import Path

state = Path(os.environ["FAKE_SLURM_STATE"])
parser = argparse.ArgumentParser()
parser.add_argument("--job-name")
parser.add_argument("--output")
parser.add_argument("--wrap")
parser.add_argument("-D")
args, _ = parser.parse_known_args()
with open(state / "counter", "a+") as f:
    f.seek(0)
    jobid = len(f.read()) + 1
    f.write("x")
with open(state / "sbatch.jsonl", "a") as f:
    f.write(json.dumps({"jobid": jobid, "argv": sys.argv[1:]}) + "\\n")
(state / f"{jobid}.name").write_text(args.job_name)
env = dict(os.environ, SLURM_JOB_ID=str(jobid), SLURM_JOBID=str(jobid))
log = open(args.output.replace("%j", str(jobid)), "w")
rc_file = state / f"{jobid}.rc"
subprocess.Popen(
    ["/bin/sh", "-c", args.wrap + f'\\necho $? > "{rc_file}.tmp"; mv "{rc_file}.tmp" "{rc_file}"'],
    cwd=args.D, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
)
print(jobid)
"""

FAKE_SQUEUE = """\
import os, sys
from pathlib import Path

state = Path(os.environ["FAKE_SLURM_STATE"])
name = sys.argv[sys.argv.index("--name") + 1]
for name_file in state.glob("*.name"):
    jobid = name_file.stem
    if name_file.read_text() != name:
        continue
    rc_file = state / f"{jobid}.rc"
    if not rc_file.exists():
        status = "RUNNING"
    else:
        status = "COMPLETED" if rc_file.read_text().strip() == "0" else "FAILED"
    print(f"{jobid}|{status}")
"""

# srun inside a job: drop srun's own options (all of the --opt=value or -xN form) and run the
# command.
FAKE_SRUN = """\
import os, sys

argv = sys.argv[1:]
while argv and argv[0].startswith("-"):
    argv.pop(0)
os.execvp(argv[0], argv)
"""

FAKE_SCONTROL = """\
print("MinJobAge               = 300 sec")
"""

FAKE_NO_ACCOUNTING = """\
import sys

sys.exit("Slurm accounting storage is disabled")
"""


def install_fake_slurm(bin_dir: Path) -> None:
    bin_dir.mkdir()
    scripts = {
        "sbatch": FAKE_SBATCH,
        "squeue": FAKE_SQUEUE,
        "srun": FAKE_SRUN,
        "scontrol": FAKE_SCONTROL,
        "sacct": FAKE_NO_ACCOUNTING,
        "sacctmgr": FAKE_NO_ACCOUNTING,
        "sshare": FAKE_NO_ACCOUNTING,
        "sinfo": 'print("batch*")\n',
        "scancel": "",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)


def tiny_config(path: Path) -> None:
    """config/quick.yaml with only a two-cell `exact` study (one job)."""
    config = yaml.safe_load((REPO / "config" / "quick.yaml").read_text())
    for name, section in config["experiments"].items():
        section["enabled"] = name == "exact"
    config["experiments"]["exact"].update(
        seeds=1, d=[2, 4], probes=["basis"], W_spectral=[None], cells_per_shard=8
    )
    path.write_text(yaml.safe_dump(config))


@pytest.mark.slow  # a real Snakemake run: about 20 s on an idle 2-core machine
def test_profile_submits_only_compute_jobs_through_sbatch(tmp_path):
    bin_dir, state, workdir = tmp_path / "bin", tmp_path / "state", tmp_path / "run"
    install_fake_slurm(bin_dir)
    state.mkdir()
    config = tmp_path / "config.yaml"
    tiny_config(config)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env["FAKE_SLURM_STATE"] = str(state)
    cmd = [
        str(SNAKEMAKE),
        "-s", str(REPO / "Snakefile"),
        "--workflow-profile", str(PROFILE.parent),
        "--configfile", str(config),
        "--directory", str(workdir),
        # The stand-in squeue answers at once: no need to wait before the first status check.
        "--slurm-init-seconds-before-status-checks", "1",
        # One compute job, and the local rules that aggregate, merge and plot its results.
        "results/all.parquet", "figures/exact_queries.png",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]

    submissions = [
        json.loads(line) for line in (state / "sbatch.jsonl").read_text().splitlines()
    ]
    comments = [s["argv"][s["argv"].index("--comment") + 1] for s in submissions]
    assert len(comments) == 1 and re.fullmatch(
        r"rule_run_shard_wildcards_exact_[0-9a-f]{16}", comments[0]), comments
    sbatch = " ".join(submissions[0]["argv"])
    # two exact cells at d <= 4: the request is a job's start-up (5 min) plus seconds, rounded up
    for option in ("-p batch", "--mem 4000", "--cpus-per-task=1", "-t 6 "):
        assert option in sbatch, f"{option!r} missing from the sbatch call: {sbatch}"
    assert (state / "1.rc").read_text().strip() == "0"

    # Every other rule ran in the Snakemake process (aggregation, merging, plots, ...), and the
    # study is complete.
    started = re.findall(r"^(local)?rule (\w+):", output, re.M)
    submitted = sorted(name for local, name in started if not local)
    local = {name for local, name in started if local}
    assert submitted == ["run_shard"], started
    assert {"aggregate_results", "merge_results", "plot_figure"} <= local, local
    assert (workdir / "results" / "all.parquet").is_file()
    assert (workdir / "figures" / "exact_queries.png").is_file()


@pytest.mark.slow  # a dry run of the cluster-sized study: about 20 s
def test_every_job_of_the_paper_study_requests_sane_resources(tmp_path):
    """A dry run of config/paper.yaml with the SLURM profile, from the root of a fresh clone: every
    job asks for between 1 minute and the cap (24 h), the compute jobs for what the cost model
    estimates (safety factor included) and the memory of the config."""
    from attnquery.study import resource_settings, study_size
    from attnquery.study.config import load_config

    from .fresh import fresh_clone, planned_jobs, shell, user_env

    clone = fresh_clone(tmp_path / "attnquery")
    out = shell("snakemake -n --workflow-profile profiles/slurm --configfile config/paper.yaml",
                clone, user_env(), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = planned_jobs(out.stdout)
    cfg = load_config(REPO / "config" / "paper.yaml")
    res = resource_settings(cfg.get("resources"))
    size = study_size(cfg)
    shards = [f for r, f in jobs if r == "run_shard"]
    assert len(shards) == sum(s["jobs"] for s in size.values())
    for rule, fields in jobs:
        runtime = int(fields["resources"]["runtime"])
        assert 1 <= runtime <= res["max_runtime_min"] <= 24 * 60, (rule, fields)
    for fields in shards:
        assert int(fields["resources"]["mem_mb"]) == res["mem_mb"]
    by_experiment = {}
    for fields in shards:
        name = fields["wildcards"]["experiment"]
        by_experiment[name] = max(by_experiment.get(name, 0), int(fields["resources"]["runtime"]))
    assert by_experiment == {n: s["max_request_min"] for n, s in size.items()}
    # the requests are not the time limit times the cells (months), nor one flat value
    assert max(by_experiment.values()) < cfg["cell_time_limit_s"] / 60 * 2
    assert len(set(by_experiment.values())) > 2


def test_cluster_scripts_are_valid_shell():
    for script in sorted((REPO / "tests" / "cluster").glob("*.sh")):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"


def test_cluster_makefile_targets_exist():
    text = (REPO / "mk" / "cluster.mk").read_text()
    assert re.search(r"^cluster-test:", text, re.M)
    assert re.search(r"^cluster-test-light:", text, re.M)
    assert "tests/cluster/run_cluster_test.sh" in text
    assert "tests/test_cluster_profile.py" in text
