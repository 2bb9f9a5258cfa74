"""The demo pipeline through profiles/slurm on a real single-node Slurm.

tests/slurm/cluster.sh starts munged, MariaDB + slurmdbd, slurmctld and slurmd (one fake
GPU) on 127.0.0.1 as root; the run goes through snakemake-executor-plugin-slurm; sacct
then shows what Slurm ran. Without root, the Debian packages or the plugin the test
skips and says why; it never imitates Slurm.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SNAKEFILE, Workflow

CLUSTER_SH = Path(__file__).resolve().parent / "slurm" / "cluster.sh"
PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
PACKAGES = "slurmctld slurmd slurm-client slurmdbd munge mariadb-server"
BINARIES = (
    "munged",
    "mungekey",
    "munge",
    "unmunge",
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "sbatch",
    "srun",
    "squeue",
    "sinfo",
    "sacct",
    "sacctmgr",
    "scancel",
    "mariadbd",
    "mariadb-install-db",
    "mariadb",
    "mariadb-admin",
    "timeout",
    "setsid",
)
PLUGIN = "snakemake-executor-plugin-slurm"
PLUGIN_MIN = (2, 7, 1)

# Small enough to finish fast: one prompt embedding, two extraction jobs (layers 0 and 4).
CONFIG = {
    "prompts": {"eagle": "A majestic eagle soaring through a cloudy sky"},
    "seeds": [0],
    "layers": [0, 4],
    "generation": {"num_frames": 6},
    # The test cluster's GPU is a Slurm gres without CUDA behind it; on a cluster,
    # device: auto means CUDA, so the jobs would rightly refuse to start.
    "device": "cpu",
}
SUBMITTED = {"encode_prompt": 1, "extract_attention": 2}  # the rest are localrules
GPU_RULES = {"extract_attention"}
TEST_PARTITION = TEST_ACCOUNT = "ci"  # what cluster.sh creates
SNAKEMAKE_TIMEOUT = 420


# --- what the test needs --------------------------------------------------------------


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def missing_requirements(which=shutil.which, euid=os.geteuid) -> list[str]:
    """Why the Slurm test cannot run here (empty when it can)."""
    reasons = []
    if euid() != 0:
        reasons.append("needs root (it starts munged, MariaDB and the Slurm daemons as root)")
    missing = [name for name in BINARIES if which(name) is None]
    if missing:
        reasons.append(f"not on PATH: {', '.join(missing)} (apt-get install {PACKAGES})")
    try:
        version = importlib.metadata.version(PLUGIN)
    except importlib.metadata.PackageNotFoundError:
        reasons.append(f"{PLUGIN} is not installed (pip install '{PLUGIN}>=2.7.1')")
    else:
        if _version(version) < PLUGIN_MIN:
            reasons.append(f"{PLUGIN} {version} is older than 2.7.1")
    return reasons


def test_missing_requirements_names_what_is_missing():
    """The skip path: a missing daemon (e.g. slurmctld not on PATH) or no root is reported."""
    found = lambda name: f"/usr/bin/{name}"  # noqa: E731
    without_ctld = lambda name: None if name == "slurmctld" else found(name)  # noqa: E731
    reasons = missing_requirements(which=without_ctld, euid=lambda: 0)
    assert any("slurmctld" in reason for reason in reasons), reasons
    assert any("needs root" in reason for reason in missing_requirements(which=found, euid=lambda: 1000))


# --- the profile ------------------------------------------------------------------------


def test_profile_shape():
    """What the issue asks of profiles/slurm, checked without a cluster."""
    profile = yaml.safe_load(PROFILE.read_text())
    assert profile["executor"] == "slurm"
    defaults, rules = profile["default-resources"], profile["set-resources"]
    assert {"slurm_partition", "slurm_account", "runtime", "mem_mb"} <= set(defaults)
    extract = rules["extract_attention"]
    assert extract["gpu"] == 1 and extract["cpus_per_gpu"] >= 1 and extract["slurm_partition"]
    # runtimes as unit strings (Snakemake 9.16.3-9.19 read plain numbers as seconds)
    for resources in (defaults, *rules.values()):
        if "runtime" in resources:
            assert re.fullmatch(r"\d+[smhd]", resources["runtime"]), resources["runtime"]
    # no managed sbatch flags smuggled through slurm_extra (plugin >= 1.9 rejects them)
    assert not any("slurm_extra" in resources for resources in (defaults, *rules.values()))


def fill_in_profile(directory: Path, partition: str, account: str, max_mem_mb: int, max_cpus: int) -> Path:
    """profiles/slurm as a user fills it in: partition and account, sized to this cluster.

    A copy of the whole profile (a flag on the command line would replace whole keys,
    see the profile's header), changed only where a site differs.
    """
    profile = yaml.safe_load(PROFILE.read_text())
    for resources in (profile["default-resources"], *profile["set-resources"].values()):
        if "slurm_partition" in resources:
            resources["slurm_partition"] = partition
        if "slurm_account" in resources:
            resources["slurm_account"] = account
        if "mem_mb" in resources:
            resources["mem_mb"] = min(resources["mem_mb"], max_mem_mb)
        if "cpus_per_gpu" in resources:
            resources["cpus_per_gpu"] = min(resources["cpus_per_gpu"], max_cpus)
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return directory


# --- the cluster ------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return f"--- {path.name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"--- {path.name}: missing ---"


def _program(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        ctld, slurmd, dbd, db = _free_ports(4)
        ports = {"CTLD_PORT": str(ctld), "SLURMD_PORT": str(slurmd), "DBD_PORT": str(dbd), "DB_PORT": str(db)}
        # Nothing of an outer Slurm job or a user profile leaks in; no GPU is preset.
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SNAKEMAKE_")) and k != "CUDA_VISIBLE_DEVICES"
        }
        self.script_env = {**base, **ports}
        # Clients and snakemake: this cluster's config, and the srun wrapper first on PATH.
        self.env = {
            **base,
            "SLURM_CONF": str(root / "etc" / "slurm.conf"),
            "PATH": f"{root / 'bin'}{os.pathsep}{base.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
        self.pids: dict[str, int] = {}

    def _script(self, action: str, limit: int) -> subprocess.CompletedProcess:
        command = ["timeout", "-s", "KILL", str(limit), "bash", str(CLUSTER_SH), action, str(self.root)]
        return subprocess.run(command, env=self.script_env, capture_output=True, text=True, timeout=limit + 30)

    def logs(self) -> str:
        log = self.root / "log"
        return "\n".join(_tail(log / name) for name in ("slurmctld.log", "slurmd.log", "slurmdbd.log", "daemons.out"))

    def start(self) -> None:
        result = self._script("start", 120)
        for path in (self.root / "run").glob("*.pid"):  # what to check at the end, also after a failed start
            if path.read_text().strip():
                self.pids[path.stem] = int(path.read_text())
        if result.returncode != 0:
            raise RuntimeError(
                f"cluster.sh start failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{self.logs()}"
            )

    def stop(self) -> subprocess.CompletedProcess:
        return self._script("stop", 90)

    def still_running(self) -> list[str]:
        """Daemons of this cluster that are alive (by PID and program name)."""
        alive = [f"{name} ({pid})" for name, pid in self.pids.items() if _program(pid) == name]
        conf = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            if _program(int(proc.name)) == "slurmstepd":
                try:
                    if conf in (proc / "environ").read_bytes().split(b"\0"):
                        alive.append(f"slurmstepd ({proc.name})")
                except OSError:
                    pass
        return alive

    def run(self, *command: str, timeout: int = 30) -> str:
        result = subprocess.run(
            ["timeout", "-s", "KILL", str(timeout), *command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout + 10,
        )
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr}")
        return result.stdout


@pytest.fixture
def slurm_cluster():
    reasons = missing_requirements()
    if reasons:
        pytest.skip("Slurm test: " + "; ".join(reasons))
    # A short path of its own under /tmp: unix socket paths are limited to 108 bytes, and
    # munged refuses a socket whose directories others cannot enter (pytest's are 0700).
    root = Path(tempfile.mkdtemp(prefix="sinkscope-slurm-", dir="/tmp"))
    cluster = Cluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        stopped = cluster.stop()
        left = cluster.still_running()
        if not left:
            shutil.rmtree(root, ignore_errors=True)
        assert not left, f"daemons still running after cluster.sh stop: {left}\n{stopped.stdout}\n{stopped.stderr}"


# --- the test ---------------------------------------------------------------------------


def sacct_jobs(cluster: Cluster) -> list[dict[str, str]]:
    fields = ("JobIDRaw", "State", "AllocTRES", "Comment", "Partition", "Account")
    text = cluster.run(
        "sacct",
        "--allusers",
        "--allocations",
        "--noheader",
        "--parsable2",
        "--starttime",
        "2000-01-01T00:00:00",
        "--format",
        ",".join(fields),
    )
    return [dict(zip(fields, line.split("|"))) for line in text.splitlines() if line.strip()]


def rule_of(comment: str) -> str:
    """The rule name in the plugin's job comment, rule_<name>[_wildcards_<...>]."""
    return re.sub(r"_wildcards_.*$", "", comment).removeprefix("rule_")


@pytest.mark.slurm
def test_demo_pipeline_runs_through_slurm(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    workflow = Workflow(tmp_path / "work")
    workflow.directory.mkdir()
    workflow.write_config(CONFIG)
    profile = fill_in_profile(tmp_path / "profile", TEST_PARTITION, TEST_ACCOUNT, max_mem_mb=1500, max_cpus=1)

    command = [
        "timeout",
        "-s",
        "KILL",
        str(SNAKEMAKE_TIMEOUT),  # snakemake ignores SIGTERM once it lost a job
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        str(workflow.directory),
        "--workflow-profile",
        str(profile),
        "--resources",
        "gpu=1",  # this cluster has one GPU
        "--slurm-init-seconds-before-status-checks",
        "2",  # default 40 s
        "--slurm-keep-successful-logs",
    ]
    result = subprocess.run(
        command, env=cluster.env, cwd=workflow.directory, capture_output=True, text=True, timeout=SNAKEMAKE_TIMEOUT + 30
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"snakemake failed ({result.returncode}):\n{output[-8000:]}\n{cluster.logs()}"
    assert "Using workflow specific profile" in output
    assert workflow.path("results/report/summary.html").exists()
    assert workflow.path("results/tables/frame_attention.parquet").exists()

    # Every submitted job ran to completion in Slurm; the localrules never went there.
    jobs = sacct_jobs(cluster)
    assert jobs, "sacct shows no jobs"
    assert {job["State"] for job in jobs} == {"COMPLETED"}, jobs
    assert Counter(rule_of(job["Comment"]) for job in jobs) == SUBMITTED, jobs
    assert {(job["Partition"], job["Account"]) for job in jobs} == {(TEST_PARTITION, TEST_ACCOUNT)}, jobs
    # The GPU jobs were allocated the GPU (sbatch --gpus=1), the others no GPU.
    for job in jobs:
        if rule_of(job["Comment"]) in GPU_RULES:
            assert "gres/gpu=1" in job["AllocTRES"].split(","), job
        else:
            assert "gres/gpu" not in job["AllocTRES"], job

    # Each Slurm job left its plugin log (kept with --slurm-keep-successful-logs).
    slurm_logs = {path.stem for path in workflow.path(".snakemake/slurm_logs").rglob("*.log")}
    assert {job["JobIDRaw"] for job in jobs} <= slurm_logs, (jobs, slurm_logs)

    # The extraction job used the device Slurm assigned: CUDA_VISIBLE_DEVICES came from
    # Slurm (the test removed it from the environment), and the job logged it.
    for layer in CONFIG["layers"]:
        log = workflow.path(f"results/logs/extract_attention/demo/eagle/seed0/layers{layer}.log").read_text()
        assert re.search(r"CUDA_VISIBLE_DEVICES=0(?![\d,])", log), log
