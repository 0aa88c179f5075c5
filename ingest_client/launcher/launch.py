"""``goodput launch [...] -- torchrun ...``: run-level events that workers cannot see.

Picks the run id and exports it (``GOODPUT_RUN_ID``, plus ``GOODPUT_URL``, the token and
``GOODPUT_ATTEMPT_BASE``) to the command, which runs as a child process with SIGTERM/SIGINT
forwarded to it. It also exports ``GOODPUT_LAUNCHED=1``, so that workers can leave ``run_end`` to
the launcher, which alone sees torchrun's exit code. Node rank 0 (or a node whose rank is unknown) sends
``run_submitted`` (when the submission time is known), ``allocation_start``, then ``allocation_end`` and ``run_end``.

Every attempt is seen: the launcher prepends ``ingest_client/_bootstrap`` to the command's ``PYTHONPATH`` (the
user's entries stay after it), whose ``sitecustomize`` starts each torchrun worker's tracker as its interpreter
starts (:mod:`ingest_client.worker.bootstrap`), and exports ``GOODPUT_LAUNCH_ID`` (new for every launch), which names
this node's agent in the count of worker generations (:mod:`ingest_client.worker.generation`). ``--no-bootstrap`` or
``GOODPUT_BOOTSTRAP=0`` leaves ``PYTHONPATH`` alone.

The node's ranks send their records through the launcher (:mod:`ingest_client.launcher.relay`): one sender per node, not
one per rank, so a fleet sends the collector fewer, fuller requests. A rank whose launcher is gone sends directly
(:mod:`ingest_client.transport.relayed`). ``--no-node-relay`` or ``GOODPUT_NODE_RELAY=0``: every rank sends its own.

Under Slurm (``SLURM_JOB_ID``) the run-level events come from Slurm's record of the job
(:mod:`ingest_client.launcher.slurm`): ``run_submitted`` at ``SubmitTime``, ``allocation_start`` at ``StartTime``
with the allocation's GPUs and hosts, ids named by the job id and restart count, sent by the first task only; a
requeue ends the allocation, not the run; ``run_end``'s status and ``detail`` follow Slurm's state (scancel, time
limit, node failure). The warning signal (``--warning-signal``, default USR1: ``sbatch --signal=B:USR1@N``) posts a
checkpoint request for the run, and the command starts with it ignored; under Slurm workers end their attempt
``preempted`` on SIGTERM.

The token reaches the command through its environment only (``GOODPUT_TOKEN``, or ``GOODPUT_TOKEN_FILE`` with
``--token-file``: the file's path), never its command line, which every user of the machine can read; ``--token``
works but says so.

Run id, in order: ``--run-id``, ``GOODPUT_RUN_ID``, SLURM (``SLURM_ARRAY_JOB_ID``_
``SLURM_ARRAY_TASK_ID`` or ``SLURM_JOB_ID``), the Kubernetes job name (``JOB_NAME`` when
``KUBERNETES_SERVICE_HOST`` is set; expose it with the downward API), else a generated id.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import quote

from ingest_client.common.config import (
    ENV_VARS,
    ClientConfig,
    Mode,
    read_token_file,
    token_from_env,
    token_in_argv_warning,
)
from ingest_client.common.errors import ConfigError
from ingest_client.common.events import ROW_EVENT, EventKind, RecordBuilder, RecordContext, RunStatus
from ingest_client.launcher.relay import EVENTS_VIA_ENV, NodeRelay
from ingest_client.launcher.slurm import SlurmJob, gpus_of_allocation, hostnames, outcome, read_job
from ingest_client.launcher.worker_exits import WorkerExitReporter
from ingest_client.transport.http import HttpTransport
from ingest_client.transport.request import Answer, exchange
from ingest_client.worker.flusher import Pipeline, PipelineSettings
from ingest_client.worker.generation import (
    GENERATION_ENV,
    LAUNCH_BASE_ENV,
    LAUNCH_ID_ENV,
    LAUNCH_NAME_ENV,
    WORKER_PID_ENV,
    agent_key,
    launch_name,
)
from ingest_client.worker.signals import PREEMPTED_MARKER_ENV
from ingest_client.worker.spool import run_dir_name

logger = logging.getLogger(__name__)


def resolve_run_id(flag: str | None, env: Mapping[str, str]) -> str:
    if flag:
        return flag
    if env.get("GOODPUT_RUN_ID"):
        return env["GOODPUT_RUN_ID"]
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("JOB_NAME"):
        return f"k8s-{env['JOB_NAME']}"
    return f"run-{uuid.uuid4().hex}"


def _option(args: Sequence[str], *names: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in a command line (last one wins)."""
    value = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def gpus_from_torchrun_args(args: Sequence[str], env: Mapping[str, str]) -> int | None:
    """``--nproc-per-node`` x ``--nnodes`` from a torchrun command line, when both are numbers."""
    nproc = _option(args, "--nproc-per-node", "--nproc_per_node")
    if nproc is None or not nproc.isdigit():
        return None
    nnodes = _option(args, "--nnodes") or "1"
    if ":" in nnodes:  # elastic range: the allocation is what SLURM gave, else the maximum
        nnodes = env.get("SLURM_JOB_NUM_NODES") or nnodes.split(":")[1]
    return int(nproc) * int(nnodes) if nnodes.isdigit() else None


def node_rank_of(args: Sequence[str], env: Mapping[str, str]) -> int | None:
    for value in (_option(args, "--node-rank", "--node_rank"), env.get("NODE_RANK"), env.get("SLURM_NODEID")):
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def attempt_base_for(args: Sequence[str], env: Mapping[str, str]) -> int | None:
    """For a requeued SLURM job: requeues x (torchrun max restarts + 1), so attempts keep growing."""
    restarts = env.get("SLURM_RESTART_COUNT", "")
    if not restarts.isdigit():
        return None
    max_restarts = _option(args, "--max-restarts", "--max_restarts") or "0"
    return int(restarts) * (int(max_restarts) + 1 if max_restarts.isdigit() else 1)


# Under Slurm the launcher forwards SIGTERM this much later than Slurm sends its own to every process of the job
# (a scancel --batch reaches only the launcher, and still reaches the command).
SLURM_TERM_FORWARD_DELAY_S = 1.0

BOOTSTRAP_DIR = Path(__file__).resolve().parents[1] / "_bootstrap"


def worker_environment(env: Mapping[str, str], *, run_id: str, bootstrap: bool) -> dict[str, str]:
    """The command's environment: the run id, a new launch id and, unless turned off, the bootstrap's path."""
    inherited = (GENERATION_ENV, WORKER_PID_ENV, LAUNCH_BASE_ENV, LAUNCH_NAME_ENV)  # this launch counts its own
    child = {name: value for name, value in env.items() if name not in inherited}
    child.update(GOODPUT_RUN_ID=run_id, GOODPUT_LAUNCHED="1")
    child[LAUNCH_ID_ENV] = f"launch{uuid.uuid4().hex[:16]}"
    if env.get("GOODPUT_BOOTSTRAP", "").strip() == "0":
        bootstrap = False
    if bootstrap:
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(BOOTSTRAP_DIR)]
        child["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), *paths])
    else:
        child["GOODPUT_BOOTSTRAP"] = "0"
    return child


def export_token(child_env: dict[str, str], *, token: str | None, token_file: str | None) -> None:
    """Give the command the token of ``--token`` or ``--token-file`` through its environment (``GOODPUT_TOKEN``,
    or ``GOODPUT_TOKEN_FILE`` naming the file), never through its command line; without either it inherits ours.
    Warns that ``--token`` exposes the token; raises ConfigError when the token file cannot be read."""
    if token:
        print(f"goodput launch: warning: {token_in_argv_warning('--token')}", file=sys.stderr)
        child_env.pop(ENV_VARS["token_file"], None)
        child_env[ENV_VARS["token"]] = token
    elif token_file:
        read_token_file(token_file, "--token-file")  # unreadable: said now, not by every worker
        child_env.pop(ENV_VARS["token"], None)
        child_env[ENV_VARS["token_file"]] = str(Path(token_file).expanduser().resolve())


class RunEventSender:
    """Run-level events through the same spool-first pipeline as the workers use."""

    def __init__(self, config: ClientConfig, run_id: str) -> None:
        transport = None
        if config.mode is Mode.ONLINE and config.events_url:
            transport = HttpTransport(config.events_url, token=config.token, timeout_s=config.http_timeout_s)
        proc_id = f"launch{uuid.uuid4().hex}"
        settings = PipelineSettings.from_config(
            config, run_id, proc_id, {"pid": os.getpid(), "run_id": run_id, "launcher": True}
        )
        builder = RecordBuilder(RecordContext(run_id=run_id, attempt=None, rank=None), proc_id)
        self.pipeline = Pipeline(settings, builder, transport)
        self.pipeline.start()

    def emit(self, kind: EventKind, time_s: float, fields: dict[str, Any]) -> None:
        self.pipeline.buffer.put((ROW_EVENT, kind, time_s, fields))

    def close(self, timeout_s: float) -> bool:
        return self.pipeline.shutdown(timeout_s)


def launch_main(argv: list[str]) -> int:
    """Run ``argv``'s command under goodput; returns the command's exit code."""
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1 :]
    elif argv and argv[0].startswith("-"):  # options only (e.g. --help): no command
        own, command = argv, []
    else:
        own, command = [], argv
    parser = argparse.ArgumentParser(prog="goodput launch", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run-id")
    parser.add_argument("--url")
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument("--token-file", help="a file whose first line is the write token (GOODPUT_TOKEN_FILE); the "
                                             "command gets the file's path, never the token on its command line")
    tokens.add_argument("--token", help="the write token; readable by every user of the machine for the whole job "
                                        "(ps): prefer --token-file, GOODPUT_TOKEN_FILE or GOODPUT_TOKEN")
    parser.add_argument("--gpus", type=int)
    parser.add_argument("--submitted-at", type=float, help="submission time, UTC seconds since the epoch")
    parser.add_argument("--job-id")
    parser.add_argument("--spool-dir")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the last events")
    parser.add_argument("--warning-signal", default="USR1",
                        help="the scheduler's preemption warning (sbatch --signal=B:USR1@120): on it the launcher "
                             "asks the run to checkpoint now (tracker.should_checkpoint()); 'none' leaves it alone")
    relay_choice = parser.add_mutually_exclusive_group()
    relay_choice.add_argument("--node-relay", dest="node_relay", action="store_true", default=None,
                       help="the default: the node's ranks send through this launcher: their records are spooled "
                            "here and sent as one stream at the collector's pace, one sender per node instead of one "
                            "per rank (ingest_client.launcher.relay); a rank whose launcher is gone sends directly")
    relay_choice.add_argument("--no-node-relay", dest="node_relay", action="store_false",
                       help="every rank sends its own records to the collector (GOODPUT_NODE_RELAY=0)")
    parser.add_argument("--no-bootstrap", action="store_true",
                        help="do not start the workers' trackers as their interpreters start (GOODPUT_BOOTSTRAP=0): "
                             "an attempt that fails before the script calls goodput.init() is then not seen")
    args = parser.parse_args(own)
    if not command:
        parser.error("no command given: goodput launch [options] -- torchrun ...")
    env = dict(os.environ)
    run_id = resolve_run_id(args.run_id, env)
    child_env = worker_environment(env, run_id=run_id, bootstrap=not args.no_bootstrap)
    for name, value in (("GOODPUT_URL", args.url), ("GOODPUT_SPOOL_DIR", args.spool_dir)):
        if value:
            child_env[name] = value
    try:
        export_token(child_env, token=args.token, token_file=args.token_file)
    except ConfigError as exc:
        parser.error(str(exc))
    if "GOODPUT_ATTEMPT_BASE" not in env and (base := attempt_base_for(command, env)) is not None:
        child_env["GOODPUT_ATTEMPT_BASE"] = str(base)
    preempted_marker: Path | None = None
    if env.get("SLURM_JOB_ID") and "GOODPUT_SIGTERM_REASON" not in env:
        # Under Slurm a worker's SIGTERM is either Slurm ending the job (preemption, requeue, scancel, time limit)
        # or torchrun stopping the survivors of a crashed worker. This launcher tells them apart for the workers:
        # it creates the marker when Slurm signals it (the warning, SIGTERM), and a worker's SIGTERM ends its
        # attempt `preempted` only when the marker exists (ingest_client.worker.signals); the run's status still comes
        # from Slurm's state (run_end).
        preempted_marker = Path(tempfile.gettempdir()) / f"goodput-preempted-{child_env[LAUNCH_ID_ENV]}"
        child_env[PREEMPTED_MARKER_ENV] = str(preempted_marker)
    job_id = (args.job_id or env.get("SLURM_JOB_ID")
              or (env.get("JOB_NAME") if env.get("KUBERNETES_SERVICE_HOST") else None))

    slurm_job = read_job(env["SLURM_JOB_ID"]) if env.get("SLURM_JOB_ID") else None
    sender: RunEventSender | None = None
    first_task = env.get("SLURM_PROCID", "0").strip() in ("0", "")  # srun: one launcher per node, one sends
    if node_rank_of(command, env) in (0, None) and first_task:
        try:
            config = ClientConfig.from_env(child_env, run_id=run_id, install_handlers=False)
        except ConfigError as exc:
            print(f"goodput launch: not recording run events: {exc}", file=sys.stderr)
        else:
            if config.mode is not Mode.DISABLED:
                sender = RunEventSender(config, run_id)
    ids = _SlurmEventIds.for_job(slurm_job, env)
    if sender is not None:
        job = {"job_id": job_id} if job_id else {}
        submitted_at = args.submitted_at
        if submitted_at is None and slurm_job is not None:
            submitted_at = slurm_job.submitted_at_s
        gpus = args.gpus if args.gpus is not None else (
            gpus_of_allocation(env) if env.get("SLURM_JOB_ID") else None) or gpus_from_torchrun_args(command, env)
        if submitted_at is not None:
            # The id names the content: a requeued job's identical repeat is a duplicate; one that sees another
            # submit time or GPU count is a second run_submitted (the earliest counts), never one id reused for
            # other content, which the collector refuses (409).
            fields = {**job, **({"gpus": gpus} if gpus else {})}
            key = hashlib.sha256(json.dumps([submitted_at, fields], sort_keys=True).encode()).hexdigest()[:16]
            sender.emit(EventKind.RUN_SUBMITTED, submitted_at, {**fields, "event_id": f"launch-run_submitted-{key}"})
        if gpus:
            # Under Slurm the allocation starts when Slurm gave the nodes (StartTime), not when this launcher
            # started: the seconds between are held GPUs, not queue.
            started_at = slurm_job.started_at_s if slurm_job is not None and slurm_job.started_at_s else None
            hosts = hostnames(slurm_job.node_list) if slurm_job is not None else []
            sender.emit(EventKind.ALLOCATION_START, started_at if started_at is not None else time.time(),
                        {"gpus": gpus, **job, **({"hosts": hosts} if hosts else {}), **ids.of_kind("allocation_start")})
        else:
            print("goodput launch: GPU count unknown (pass --gpus); allocation_start not sent", file=sys.stderr)

    relay = None
    if args.node_relay if args.node_relay is not None else env.get("GOODPUT_NODE_RELAY", "1").strip() != "0":
        relay = _start_relay(child_env, run_id)
    warning = _warning_signal(args.warning_signal)
    # One request per run: srun forwards the warning to every node's launcher; the first task asks.
    asks = warning is not None and node_rank_of(command, env) in (0, None) and first_task
    on_warning = _checkpoint_requester(child_env, run_id) if asks else None
    exits = _WorkerExits(child_env, run_id, sender)
    try:
        code = _run_child(command, child_env, warning=warning, on_warning=on_warning,
                          term_delay_s=SLURM_TERM_FORWARD_DELAY_S if env.get("SLURM_JOB_ID") else 0.0,
                          on_scheduler_signal=(lambda: _touch(preempted_marker)) if preempted_marker else None,
                          on_stderr_line=exits.reporter.on_line if exits.reporter is not None else None)
    finally:
        exits.close(args.timeout)
        if preempted_marker is not None:
            preempted_marker.unlink(missing_ok=True)
        if relay is not None and not relay.close(args.timeout):
            print(f"goodput launch: the node relay could not forward every post in {args.timeout:g} s; the ranks' "
                  "spools keep what the collector has not acknowledged: the next process of the run or "
                  "`goodput sync` sends it", file=sys.stderr)

    if sender is not None:
        job = {"job_id": job_id} if job_id else {}
        sender.emit(EventKind.ALLOCATION_END, time.time(), {**job, **ids.of_kind("allocation_end")})
        if slurm_job is not None:
            ended = outcome(read_job(slurm_job.job_id), code, ids.restarts)
            if ended.status is not None:  # None: requeued, the run goes on in the next allocation
                sender.emit(EventKind.RUN_END, time.time(), {"status": ended.status.value, **ids.of_kind("run_end"),
                                                             **({"detail": ended.detail} if ended.detail else {})})
        else:
            status = RunStatus.FINISHED if code == 0 else RunStatus.FAILED
            sender.emit(EventKind.RUN_END, time.time(), {"status": status.value})
        if not sender.close(args.timeout):
            print("goodput launch: some run events are still in the spool; `goodput sync` sends them",
                  file=sys.stderr)
    return code


class _WorkerExits:
    """On every node: the workers torchrun reports failed, sent as their ``attempt_end`` with the exit status
    (:mod:`ingest_client.launcher.worker_exits`), through node 0's run-event sender or, on another node, one made at the
    first failure."""

    def __init__(self, child_env: dict[str, str], run_id: str, sender: RunEventSender | None) -> None:
        self.reporter: WorkerExitReporter | None = None
        self._sender, self._own = sender, False
        self._lock = threading.Lock()
        try:
            self._config = ClientConfig.from_env(child_env, run_id=run_id, install_handlers=False)
        except ConfigError:
            return  # said by the run-event sender or the workers
        if self._config.mode is Mode.DISABLED:
            return
        self._run_id = run_id
        self.reporter = WorkerExitReporter(
            self._emit, run_dir=self._config.spool_dir / run_dir_name(run_id), launch_key=agent_key(child_env),
            launch_name=launch_name(dict(child_env), torchrun_worker=True))

    def _emit(self, kind: EventKind, time_s: float, fields: dict[str, Any]) -> None:
        with self._lock:
            if self._sender is None:
                self._sender, self._own = RunEventSender(self._config, self._run_id), True
            self._sender.emit(kind, time_s, fields)

    def close(self, timeout_s: float) -> None:
        with self._lock:
            if self._own and self._sender is not None and not self._sender.close(timeout_s):
                print("goodput launch: a worker's exit is still in the spool; `goodput sync` sends it",
                      file=sys.stderr)


def _pass_on(stream: Any, on_line: Callable[[bytes], None]) -> threading.Thread:
    """Copies the command's stderr to ours as it comes (progress bars without a newline included) and hands each
    complete line to `on_line`."""
    out = getattr(sys.stderr, "buffer", None)

    def run() -> None:
        pending = b""
        fd = stream.fileno()
        while chunk := os.read(fd, 65536):
            try:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stderr.write(chunk.decode("utf-8", "replace"))
            except (OSError, ValueError):
                pass  # our stderr is gone: keep draining, so the command never blocks on a full pipe
            *lines, pending = (pending + chunk).split(b"\n")
            pending = pending[-65536:]
            for line in lines:
                try:
                    on_line(line)
                except Exception:  # a report lost is never worth the command's output
                    logger.exception("goodput launch: reading the command's output failed")

    thread = threading.Thread(target=run, name="goodput-command-stderr", daemon=True)
    thread.start()
    return thread


def _start_relay(child_env: dict[str, str], run_id: str) -> NodeRelay | None:
    """Start the node relay and point the workers at it; None (workers send directly) when it cannot run."""
    try:
        config = ClientConfig.from_env(child_env, run_id=run_id, install_handlers=False)
    except ConfigError as exc:
        print(f"goodput launch: no node relay: {exc}", file=sys.stderr)
        return None
    if config.mode is not Mode.ONLINE:
        return None
    try:
        relay = NodeRelay(config, run_id).start()
    except OSError as exc:
        print(f"goodput launch: no node relay ({exc}); the workers send directly", file=sys.stderr)
        return None
    child_env[EVENTS_VIA_ENV] = relay.url
    return relay


class _SlurmEventIds:
    """Event ids of one Slurm allocation's run-level events: the job id and restart count name them, so a
    second launcher of the same allocation (srun on a node that also runs one, a replayed spool) sends the
    same events again as duplicates, never as a second allocation."""

    def __init__(self, prefix: str | None, restarts: int | None = None) -> None:
        self.prefix = prefix
        self.restarts = restarts  # Slurm's restart count when this allocation started

    @classmethod
    def for_job(cls, job: SlurmJob | None, env: Mapping[str, str]) -> _SlurmEventIds:
        if job is None:
            return cls(None)
        value = env.get("SLURM_RESTART_COUNT", "")
        restarts = int(value) if value.isdigit() else job.restarts
        return cls(f"slurm-{job.job_id}-r{restarts}", restarts)

    def of_kind(self, kind: str) -> dict[str, str]:
        return {"event_id": f"{self.prefix}-{kind}"} if self.prefix else {}


def _warning_signal(name: str) -> signal.Signals | None:
    if name.strip().lower() in ("", "none", "0"):
        return None
    name = name.strip().upper()
    try:
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except KeyError:
        raise SystemExit(f"goodput launch: --warning-signal {name!r} is not a signal name (USR1, USR2, URG or "
                         "none)") from None


CHECKPOINT_REQUEST_TIMEOUT_S = 5.0  # the whole request


def _checkpoint_requester(env: Mapping[str, str], run_id: str) -> Callable[[str], None]:
    """A function that posts a checkpoint request for the run (``POST /v1/runs/{id}/checkpoint-request``), off
    the signal handler's thread; workers see it in ``tracker.should_checkpoint()`` within their poll interval."""
    url = env.get("GOODPUT_URL", "").rstrip("/")
    try:
        token = token_from_env(env)
    except ConfigError as exc:  # the workers' init() says so too
        print(f"goodput launch: checkpoint requests will go without a token: {exc}", file=sys.stderr)
        token = None

    def post(reason: str) -> None:
        if not url:
            print("goodput launch: preemption warning, but no GOODPUT_URL to ask the run to checkpoint",
                  file=sys.stderr)
            return
        body = json.dumps({"reason": reason, "requested_by": "goodput launch"}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   **({"Authorization": f"Bearer {token}"} if token else {})}
        failure = ""
        for _ in range(3):
            try:
                answer = exchange(f"{url}/v1/runs/{quote(run_id, safe='')}/checkpoint-request", method="POST",
                                  headers=headers, data=body, timeout_s=CHECKPOINT_REQUEST_TIMEOUT_S)
            except (OSError, ValueError) as exc:
                failure = str(exc)
            else:
                if _is_checkpoint_request(answer):
                    print(f"goodput launch: {reason}: asked run {run_id} to checkpoint", file=sys.stderr)
                    return
                failure = answer.describe()
                if answer.status < 400:  # something else answers at the URL: asking again changes nothing
                    failure += (" (not the collector: check GOODPUT_URL, the collector's base URL reached without a "
                                "login page or a redirect)")
                    break
            time.sleep(0.5)
        print(f"goodput launch: {reason}: checkpoint request to {url} failed: {failure}", file=sys.stderr)

    def request(reason: str) -> None:
        threading.Thread(target=post, args=(reason,), name="goodput-checkpoint-request", daemon=False).start()

    return request


def _is_checkpoint_request(answer: Answer) -> bool:
    """Whether ``answer`` is the collector's: 201 with the request it created (its ``id``)."""
    if not 200 <= answer.status < 300:
        return False
    try:
        payload = json.loads(answer.body)
    except ValueError:
        return False
    return isinstance(payload, dict) and type(payload.get("id")) is int


def _touch(path: Path) -> None:
    try:
        path.touch()
    except OSError as exc:
        print(f"goodput launch: cannot create {path} ({exc}); workers will report this SIGTERM as a failure",
              file=sys.stderr)


def _run_child(command: list[str], env: dict[str, str], *, warning: signal.Signals | None = None,
               on_warning: Callable[[str], None] | None = None, term_delay_s: float = 0.0,
               on_scheduler_signal: Callable[[], None] | None = None,
               on_stderr_line: Callable[[bytes], None] | None = None) -> int:
    """Runs the command with SIGTERM/SIGINT forwarded to it (SIGTERM ``term_delay_s`` later: under Slurm every
    process of the job gets Slurm's own SIGTERM, and a second one on its heels could cut a worker's SIGTERM
    handler short before it recorded the attempt's end) and ``warning`` turned into ``on_warning``."""
    # The command starts with the warning signal ignored (an ignored signal stays ignored across exec): srun and
    # Slurm deliver it to every process of the step, and torchrun or a worker would die of it (its default
    # action). A program that wants it installs its own handler (Lightning's SLURMEnvironment does).
    before = signal.signal(warning, signal.SIG_IGN) if warning is not None else None
    try:
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE if on_stderr_line is not None else None)
    except OSError as exc:
        print(f"goodput launch: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    finally:
        if warning is not None:
            signal.signal(warning, before)

    def send(signum: int) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGTERM and on_scheduler_signal is not None:
            on_scheduler_signal()
        if signum == signal.SIGTERM and term_delay_s > 0:
            threading.Timer(term_delay_s, send, args=(signum,)).start()
        else:
            send(signum)

    def warned(signum: int, _frame: FrameType | None) -> None:
        if on_scheduler_signal is not None:
            on_scheduler_signal()
        if on_warning is not None:
            on_warning(f"preemption warning ({signal.Signals(signum).name})")

    reader = _pass_on(child.stderr, on_stderr_line) if on_stderr_line is not None else None
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    if warning is not None:
        previous[warning] = signal.signal(warning, warned)
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - the handler above replaces SIGINT
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if reader is not None:  # its last lines; a worker that outlived the command may hold the pipe open
        reader.join(timeout=2.0)
    return code if code >= 0 else 128 - code
