"""A one-node Slurm on this machine: munged, slurmctld and slurmd as root, configured in a temporary directory.

The cluster has one node (this host, its CPUs) in one partition, ``select/linear`` (a job takes the whole node,
so a second job waits in the queue), ``proctrack/linuxproc`` and ``task/none`` (no cgroups). Its own munge key
and socket, its own ports, state and spool under the temporary directory; ``SLURM_CONF`` in ``SlurmCluster.env``
points at its ``slurm.conf``, so nothing under /etc is read or changed. Torn down (every daemon stopped by its
pid) at the end of the session. Skipped with the reason when Slurm's or munge's programs are missing, or when
not root (slurmd must start jobs as their users).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    root: Path
    node: str
    env: dict[str, str]
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *args: str, timeout_s: float = 30.0) -> str:
        done = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, script: Path, *options: str) -> str:
        """Submits ``script``; returns the job id."""
        return self.run("sbatch", "--parsable", *options, str(script)).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o``'s fields."""
        from ingest_client.launcher.slurm import parse_scontrol_job

        return parse_scontrol_job(self.run("scontrol", "show", "job", "-o", job_id))

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout_s: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not in {states} after {timeout_s} s: {fields.get('JobState')} "
                             f"({fields.get('Reason')}); logs under {self.root}")

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Until the node is idle again (no job on it)."""
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-N", "-o", "%T").strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise AssertionError(f"node {self.node} is {state!r}, not idle, after {timeout_s} s; logs under {self.root}")

    def stop(self) -> None:
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.daemons):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _why_not() -> str | None:
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return (f"Slurm not installed ({', '.join(missing)} missing): `apt-get install -y slurm-wlm munge` "
                "runs a one-node Slurm here")
    if os.geteuid() != 0:
        return "a one-node Slurm needs root (slurmd starts jobs as their users); run the tests as root"
    return None


def _write_config(root: Path, node: str, cpus: int) -> Path:
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir()
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=goodputtest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge.socket'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/linear",
        "SchedulerType=sched/builtin",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobRequeue=1",
        "KillWait=5",
        "MinJobAge=300",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    return conf


def _start(cluster: SlurmCluster, *argv: str) -> None:
    log = open(cluster.root / "log" / f"{Path(argv[0]).name}.out", "wb")  # noqa: SIM115 - kept by the process
    cluster.daemons.append(subprocess.Popen(list(argv), env=cluster.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL))
    log.close()


def start_cluster(root: Path) -> SlurmCluster:
    node = socket.gethostname().split(".")[0]
    conf = _write_config(root, node, os.cpu_count() or 1)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in [n for n in env if n.startswith(("SLURM_", "SBATCH_", "SRUN_")) and n != "SLURM_CONF"]:
        del env[name]
    cluster = SlurmCluster(root=root, node=node, env=env)
    try:
        _start(cluster, "munged", "-F", "--force", f"--socket={root / 'munge.socket'}", f"--key-file={key}",
               f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}",
               f"--seed-file={root / 'munged.seed'}")
        _wait_for(lambda: (root / "munge.socket").exists(), "munged's socket", cluster)
        _start(cluster, "slurmctld", "-D", "-i", "-f", str(conf))
        _wait_for(lambda: _answers(cluster, "scontrol", "ping"), "slurmctld", cluster)
        _start(cluster, "slurmd", "-D", "-N", node, "-f", str(conf))
        _wait_for(lambda: _answers(cluster, "sinfo", "-h", "-N", "-o", "%T", expect="idle"), "node idle", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(cluster: SlurmCluster, *argv: str, expect: str | None = None) -> bool:
    try:
        done = subprocess.run(list(argv), env=cluster.env, capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired:
        return False
    if done.returncode != 0:
        return False
    return expect is None or done.stdout.strip() == expect


def _wait_for(ready: object, what: str, cluster: SlurmCluster, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        dead = [p.args for p in cluster.daemons if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead} exited while waiting for {what}; logs under {cluster.root / 'log'}")
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout_s} s; logs under {cluster.root / 'log'}")


def _port_taken(root: Path) -> bool:
    return any("Address already in use" in log.read_text(errors="replace") for log in (root / "log").glob("*"))


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    for attempt in range(3):
        root = Path(tempfile.mkdtemp(prefix="goodput-slurm-"))
        try:
            cluster = start_cluster(root)
            break
        except RuntimeError:
            # The ports were free when picked, but another process (an outgoing connection's ephemeral port) can
            # take one before the daemon binds it: pick new ones. Anything else is a real failure.
            if attempt == 2 or not _port_taken(root):
                raise
            shutil.rmtree(root, ignore_errors=True)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
