"""`goodput`: the command line. Imports only the standard library at the top, so `goodput launch` and
`goodput sync` work where only the client is installed; server commands import their modules lazily."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pydantic import ValidationError
    from sqlalchemy import Engine

    from services.api_client import ApiClient
    from services.settings import ClientSettings, ServerSettings, ServiceSettings

DB_HELP = "database URL (default: GOODPUT_DATABASE_URL, else sqlite:///goodput.db in the current folder)"
URL_HELP = "collector URL (default: GOODPUT_URL, else http://127.0.0.1:8000)"
PROJECT_HELP = ("the run's project: needed with a read token of every project ('*') when several projects use the "
                "run id (a token of one project always gets its own run)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "launch":  # everything after `launch` belongs to the launcher
        from ingest_client.launcher.launch import launch_main

        return launch_main(args[1:])
    if args and args[0] == "sync":
        from ingest_client.tools.sync import sync_main

        return sync_main(args[1:])
    parser = _parser()
    ns = parser.parse_args(args)
    if not hasattr(ns, "handler"):
        parser.print_help()
        return 2
    try:
        return int(ns.handler(ns) or 0)
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="goodput", description="Where the GPU-hours of distributed training go.")
    sub = p.add_subparsers(metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the collector (and the dashboard) after applying migrations")
    serve.add_argument("--db", help=DB_HELP)
    serve.add_argument("--host", help="listen address (default GOODPUT_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default GOODPUT_PORT or 8000)")
    serve.add_argument("--workers", type=int, default=1, help="collector processes (PostgreSQL only for > 1)")
    serve.add_argument("--no-dashboard", action="store_true", help="do not serve the dashboard under /dashboard/")
    serve.set_defaults(handler=_serve)

    db = sub.add_parser("db", help="database migrations")
    db_sub = db.add_subparsers(metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="apply every migration (to head)")
    up.add_argument("--db", help=DB_HELP)
    up.set_defaults(handler=_db_upgrade)
    check = db_sub.add_parser("check", help="exit 1 if the database schema differs from the models")
    check.add_argument("--db", help=DB_HELP)
    check.set_defaults(handler=_db_check)
    prune = db_sub.add_parser(
        "prune", help="delete the raw rows of runs quiet for GOODPUT_RAW_RETENTION_DAYS (their analyses are stored "
                      "first and kept); exit 0 done, 1 the retention is not a finite number of days >= 0 (nothing "
                      "touched), 2 another process is pruning, 3 some runs were left whole")
    prune.add_argument("--db", help=DB_HELP)
    prune.add_argument("--days", type=float, help=(
        "retention in days, a finite number >= 0; 0 keeps raw rows (default: GOODPUT_RAW_RETENTION_DAYS, 30)"))
    prune.add_argument("--dry-run", action="store_true", help="print what would be deleted, change nothing")
    prune.set_defaults(handler=_db_prune)

    from services.cli.analyst import add_analyst_parser  # standard library only, like the tokens' parser
    from services.cli.tokens import add_token_parser  # standard library only, like this module

    add_analyst_parser(sub, DB_HELP)
    add_token_parser(sub, DB_HELP)

    sim = sub.add_parser("simulate", help="simulate a training job and send its events to a collector")
    sim.add_argument("--url", help=URL_HELP)
    sim_tokens = sim.add_mutually_exclusive_group()
    sim_tokens.add_argument("--token-file", help="a file whose first line is the write token (default: GOODPUT_TOKEN, "
                                                 "else GOODPUT_TOKEN_FILE)")
    sim_tokens.add_argument("--token", help="the write token; readable by every user of the machine while it runs "
                                            "(ps): prefer --token-file or the variables")
    sim.add_argument("--run-id")
    sim.add_argument("--ranks", type=int, default=8)
    sim.add_argument("--gpus", type=int, help="allocated GPUs (default: ranks)")
    sim.add_argument("--hours", type=float, default=1.0, help="useful compute the job needs (hours)")
    sim.add_argument("--step-seconds", type=float, default=1.0)
    sim.add_argument("--mtbf", type=float, default=1800.0, help="mean seconds between failures; 0 = none")
    sim.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    sim.add_argument("--checkpoint-seconds", type=float, default=10.0)
    sim.add_argument("--restart-seconds", type=float, default=60.0, help="process start to first step")
    sim.add_argument("--detect-seconds", type=float, default=30.0, help="failure to teardown")
    sim.add_argument("--hang-at-step", type=int, help="one rank hangs at this step")
    sim.add_argument("--hang-seconds", type=float, default=600.0, help="collective timeout ending the hang")
    sim.add_argument("--straggler-rank", type=int)
    sim.add_argument("--straggler-factor", type=float, default=1.5)
    sim.add_argument("--end", choices=["finished", "failed", "running"], default="finished")
    sim.add_argument("--max-failures", type=int, default=1000)
    sim.add_argument("--start-time", type=float, help="epoch seconds of the submission (default: now - duration)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--truth", action="store_true", help="print the ledger the job must produce as JSON")
    sim.set_defaults(handler=_calls_the_collector(_simulate, "simulate", errors_to_stderr=True))

    runs = sub.add_parser("runs", help="list runs, the most wasted GPU-hours first",
                          description="goodput runs [--project P] [--status failed] [--since 2026-01-31] "
                                      "[--last 24h] [--run-id PART] [--limit N] [--json]")
    runs.add_argument("--url", help=URL_HELP)
    runs.add_argument("--project", help="only this project's runs (a token of one project sees only its own)")
    runs.add_argument("--status", choices=["running", "finished", "failed", "cancelled"], help="only these")
    runs.add_argument("--since", help="runs with GPU time at or after this time (epoch seconds or ISO 8601); their "
                                      "figures are those inside the range, as on the dashboard")
    runs.add_argument("--until", help="runs with GPU time before this time (epoch seconds or ISO 8601)")
    runs.add_argument("--last", help="the last DURATION on the collector's clock: 90m, 24h, 7d (instead of --since); "
                                     "the dashboard's 'Last hour' is --last 1h")
    runs.add_argument("--run-id", dest="run_id_part", metavar="PART", help="runs whose id contains PART")
    runs.add_argument("--limit", type=int, help="only the worst N runs")
    runs.add_argument("--json", action="store_true", help="the runs as JSON, worst first")
    runs.set_defaults(handler=_calls_the_collector(_runs, "runs"))

    ledger = sub.add_parser("ledger", help="print one run's waste ledger")
    ledger.add_argument("run_id")
    ledger.add_argument("--url", help=URL_HELP)
    ledger.add_argument("--json", action="store_true")
    ledger.add_argument("--project", help=PROJECT_HELP)
    ledger.set_defaults(handler=_calls_the_collector(_ledger, "ledger"))

    failures = sub.add_parser("failures", help="why each failed attempt of a run failed: rank, host, exit signal, "
                                                "error text, hung ranks")
    failures.add_argument("run_id")
    failures.add_argument("--url", help=URL_HELP)
    failures.add_argument("--json", action="store_true", help="the failures as GET /v1/runs/{id}/view serves them "
                                                              "(timeline.failures)")
    failures.add_argument("--project", help=PROJECT_HELP)
    failures.set_defaults(handler=_calls_the_collector(_failures, "failures"))

    report = sub.add_parser("report", help="save a run's waste report (json, csv, html), or the fleet CSV, to a file",
                            description="goodput report RUN_ID [--format html] [-o run.html | -o -]; "
                                        "goodput report --fleet [--since T] [--until T] [-o fleet.csv]")
    report.add_argument("run_id", nargs="?", help="the run (omit with --fleet)")
    report.add_argument("--fleet", action="store_true", help="one CSV row per run instead of one run's report")
    report.add_argument("--format", choices=["json", "csv", "html"], help="default: html for a run, csv for --fleet")
    report.add_argument("-o", "--output", help="file to write; - for standard output (default: RUN_ID-report.FORMAT, "
                                               "or goodput-fleet.csv, in the current folder)")
    report.add_argument("--since", help="--fleet: runs with events at or after this time (epoch seconds or ISO 8601)")
    report.add_argument("--until", help="--fleet: runs with events at or before this time (epoch seconds or ISO 8601)")
    report.add_argument("--status", choices=["running", "finished", "failed", "cancelled"], help="--fleet: only these")
    report.add_argument("--self-contained", action="store_true", help=(
        "html: inline plotly.js, for a file opened away from the collector (4.9 MB); by default the charts load it "
        "from the collector (tens of kB)"))
    report.add_argument("--url", help=URL_HELP)
    report.add_argument("--project", help=PROJECT_HELP + "; with --fleet: only this project's runs")
    report.set_defaults(handler=_calls_the_collector(_report, "report", errors_to_stderr=True))

    advise = sub.add_parser("advise", help="what to change in a run, the most GPU-hours at stake first")
    advise.add_argument("run_id")
    advise.add_argument("--url", help=URL_HELP)
    advise.add_argument("--json", action="store_true", help="the advice as GET /v1/runs/{id}/advice serves it")
    advise.add_argument("--project", help=PROJECT_HELP)
    advise.set_defaults(handler=_calls_the_collector(_advise, "advise"))

    interval = sub.add_parser("simulate-interval", help="goodput against checkpoint interval: model and Monte Carlo")
    interval.add_argument("--delta", type=float, required=True, help="seconds one checkpoint blocks training")
    interval.add_argument("--mtbf", type=float, required=True, help="mean seconds between failures")
    interval.add_argument("--restart", type=float, default=0.0, help="seconds from a failure to useful work again")
    interval.add_argument("--work", type=float, default=100.0, help="useful compute the job needs (hours)")
    interval.add_argument("--intervals", type=float, nargs="*", default=[], help="more intervals to compare (s)")
    interval.add_argument("--replicates", type=int, default=200)
    interval.add_argument("--seed", type=int, default=0)
    interval.set_defaults(handler=_simulate_interval)

    sub.add_parser("sync", help="send what a spool folder holds that the collector never acknowledged or refused "
                                "(the quarantine, after fixing the cause): goodput sync DIR [--url URL] "
                                "[--token-file F]")

    sub.add_parser("launch", help="run torchrun (or any launcher) and report submission/allocation/run end: "
                                  "goodput launch [--gpus N] -- torchrun ...")
    return p


Handler = Callable[[argparse.Namespace], int]


def _calls_the_collector(handler: Handler, command: str, *, errors_to_stderr: bool = False) -> Handler:
    """A command whose answer comes from the collector's API: when the API fails it, one line says why (where its
    table would have been, or on standard error for a command whose output is a document) and it exits 1."""

    def run(ns: argparse.Namespace) -> int:
        from services.api_client import ApiError

        try:
            return handler(ns)
        except ApiError as exc:
            print(f"goodput {command}: {exc}", file=sys.stderr if errors_to_stderr else sys.stdout)
            return 1

    return run


def _api(ns: argparse.Namespace, *, write: bool = False) -> ApiClient:
    """The collector at --url (else GOODPUT_URL), with the read token (GOODPUT_READ_TOKEN), or with the write
    token (--token or --token-file, else GOODPUT_TOKEN or GOODPUT_TOKEN_FILE) to send events."""
    from services.api_client import ApiClient, bearer
    from services.settings import ClientSettings

    settings = ClientSettings()
    token = _write_token(ns, settings) if write else settings.read_token
    return ApiClient(ns.url or settings.url, credential=bearer(token))


def _write_token(ns: argparse.Namespace, settings: ClientSettings) -> str | None:
    """The write token of a command that sends events, as the training client resolves it; exits 2 when a token
    file cannot be read."""
    from ingest_client.common.config import read_token_file, token_from_env, token_in_argv_warning
    from ingest_client.common.errors import ConfigError

    if ns.token:
        print(f"goodput: warning: {token_in_argv_warning('--token')}", file=sys.stderr)
        return str(ns.token)
    try:
        if ns.token_file:
            return read_token_file(ns.token_file, "--token-file")
        return token_from_env({"GOODPUT_TOKEN": settings.token or "", "GOODPUT_TOKEN_FILE": settings.token_file or ""})
    except ConfigError as exc:
        print(f"goodput: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _database_url(ns: argparse.Namespace) -> str:
    from services.settings import ServerSettings

    return getattr(ns, "db", None) or ServerSettings().database_url


def _serve(ns: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from services.settings import ServerSettings, ServiceSettings, hand_to_worker_processes
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    server: dict[str, Any] = {name: value for name, value in (("database_url", ns.db), ("host", ns.host),
                                                             ("port", ns.port)) if value}
    if ns.no_dashboard:
        server["serve_dashboard"] = False
    try:
        settings = ServiceSettings(server=ServerSettings(**server))
    except ValidationError as exc:  # e.g. GOODPUT_RAW_RETENTION_DAYS=nan: said in one line each, nothing started
        print_settings_problems("goodput serve", exc)
        return 1
    url, host, port = settings.server.database_url, settings.server.host, settings.server.port
    engine = make_engine(url)
    upgrade(engine)
    _ensure_partitions(engine)
    auth = _auth_mode(engine, host)
    engine.dispose()
    if ns.workers > 1 and url.startswith("sqlite"):
        print("goodput: --workers > 1 needs PostgreSQL (SQLite has one writer); serving with 1 worker",
              file=sys.stderr)
        ns.workers = 1
    background = _background_mode(settings.server)
    from services.metrics import prepare_multiprocess_dir, remove_multiprocess_dir

    # several processes count into shared files: /metrics sums them
    metrics_dir = prepare_multiprocess_dir(ns.workers + (background == "process"))
    hand_to_worker_processes(settings)
    analyst = None
    if background == "process":
        from services.cli.analyst import AnalystProcess

        analyst = AnalystProcess(env=dict(os.environ))  # the settings as given; the workers then run no job
        analyst.start()
    hand_to_worker_processes(_workers(settings, background))
    print(f"goodput collector on http://{host}:{port}  (database: {_safe(engine)}; API docs at /docs)", flush=True)
    print(auth, flush=True)
    if analyst is not None:
        print(f"background analyses and retention: in a process of their own (pid {analyst.pid})", flush=True)
    elif settings.server.analyst == "elsewhere" and background == "none":
        print("background analyses and retention: left to a `goodput analyst` run apart (GOODPUT_ANALYST=elsewhere)",
              flush=True)
    with _cleanup_before_dying_of(signal.SIGTERM):
        try:
            uvicorn.run("services.collector.app:create_served_app", factory=True, host=host, port=port,
                        workers=ns.workers, log_level="warning", access_log=False)  # (at INFO: never shown)
        finally:
            if analyst is not None:
                analyst.stop()
            remove_multiprocess_dir(metrics_dir)
    return 0


def _workers(settings: ServiceSettings, background: str) -> ServiceSettings:
    """The workers' settings. Beside an analyst that keeps the stored analyses (the process started here with
    GOODPUT_WARM_ANALYSES_S > 0, or one run apart: GOODPUT_ANALYST=elsewhere) what is polled serves them
    (`beside_an_analyst`); beside one that runs retention alone they run no job and build what they serve."""
    from services.settings import beside_an_analyst

    server = settings.server
    if background == "thread":
        return settings.model_copy(update={"server": server.model_copy(update={"analyst": "thread"})})
    if server.analyst == "elsewhere" or (background == "process" and server.warm_analyses_s > 0):
        return beside_an_analyst(settings)
    if background == "process":
        return settings.model_copy(update={
            "server": server.model_copy(update={"warm_analyses_s": 0.0, "prune_interval_s": 0.0})})
    return settings


class _DyingOf(BaseException):
    def __init__(self, signum: int) -> None:
        self.signum = signum


@contextlib.contextmanager
def _cleanup_before_dying_of(signum: int) -> Iterator[None]:
    """One worker's uvicorn shuts down on SIGTERM, then raises the signal again with the handler it found: the
    default one ended the process there, past every `finally`. With this handler the `finally` blocks run first
    (the analyst is stopped, the metrics files removed), then the process ends of the signal all the same."""
    def dying(received: int, _frame: object) -> None:
        raise _DyingOf(received)

    previous = signal.signal(signum, dying)
    try:
        yield
    except _DyingOf as exc:
        signal.signal(exc.signum, signal.SIG_DFL)
        signal.raise_signal(exc.signum)
    finally:
        signal.signal(signum, previous)


def _background_mode(server: ServerSettings) -> Literal["process", "thread", "none"]:
    """Where the background analyses and retention run (GOODPUT_ANALYST), said on stderr when it is not as asked."""
    sqlite = server.database_url.startswith("sqlite")
    if server.analyst == "elsewhere" and sqlite:
        print("goodput: GOODPUT_ANALYST=elsewhere needs PostgreSQL (`goodput analyst` does not run on SQLite); the "
              "background analyses run in the collector's process", file=sys.stderr)
    elif server.analyst == "elsewhere" or (server.warm_analyses_s <= 0 and server.prune_interval_s <= 0):
        return "none"
    if server.analyst == "process" and sqlite:
        print("goodput: GOODPUT_ANALYST=process needs PostgreSQL (SQLite has one writer); the background analyses "
              "run in the collector's process", file=sys.stderr)
    return "thread" if server.analyst == "thread" or sqlite else "process"


def _auth_mode(engine: Engine, host: str) -> str:
    from services.storage.tokens import has_active_tokens, list_tokens

    with engine.connect() as conn:
        if has_active_tokens(conn):
            active = [t for t in list_tokens(conn) if t.active]
            projects = sorted({t.project for t in active})
            return (f"authentication on: {len(active)} active token(s) for project(s) {', '.join(projects)}; "
                    "every request needs one (goodput token list)")
    exposed = "" if host in ("127.0.0.1", "::1", "localhost") else (
        f" Listening on {host}, remote clients get 403 until a token exists.")
    return ("authentication off: no access token exists, so only localhost clients are accepted; create tokens "
            "with `goodput token create --project P --kind write|read`." + exposed)


def _db_upgrade(ns: argparse.Namespace) -> int:
    from services.storage.db import make_engine
    from services.storage.migrate import current_revision, upgrade

    url = _database_url(ns)
    engine = make_engine(url)
    upgrade(engine)
    print(f"{_safe(engine)}: at revision {current_revision(engine)}")
    return 0


def _db_check(ns: argparse.Namespace) -> int:
    from services.storage.db import make_engine
    from services.storage.migrate import schema_drift

    drift = schema_drift(make_engine(_database_url(ns)))
    for diff in drift:
        print(diff)
    print("schema matches the models" if not drift else f"{len(drift)} difference(s): write a migration")
    return 1 if drift else 0


def _ensure_partitions(engine: Engine) -> None:
    import time

    from services.storage.retention import ensure_partitions

    with engine.begin() as conn:
        ensure_partitions(conn, now=time.time())


def _db_prune(ns: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from services.cli.retention import prune_lines
    from services.derive.cache import AnalysisCache
    from services.derive.retention import PruneBusy, prune
    from services.settings import ServerSettings, check_retention_days
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    try:  # checked before the database is opened: a cutoff of NaN matched every run on PostgreSQL
        days = (check_retention_days(ns.days, setting="--days") if ns.days is not None
                else ServerSettings().raw_retention_days)
    except (ValueError, ValidationError) as exc:
        problems = ([settings_problem(e["loc"], str(e["msg"])) for e in exc.errors()]
                    if isinstance(exc, ValidationError) else [str(exc)])
        for problem in problems:
            print(f"goodput db prune: {problem}; nothing was pruned", file=sys.stderr)
        return 1
    engine = make_engine(_database_url(ns))
    upgrade(engine)
    try:
        result = prune(AnalysisCache(engine), retention_days=days, dry_run=ns.dry_run,
                       setting="--days" if ns.days is not None else "GOODPUT_RAW_RETENTION_DAYS")
    except PruneBusy as exc:
        print(f"goodput db prune: {exc}", file=sys.stderr)
        return 2
    for line in prune_lines(result, days=days, dry_run=ns.dry_run):
        print(line)
    return 3 if result.left_whole else 0


def print_settings_problems(command: str, exc: ValidationError) -> None:
    """Each settings error on stderr, one line each, naming the variable."""
    for error in exc.errors():
        print(f"{command}: {settings_problem(error['loc'], str(error['msg']))}", file=sys.stderr)


def settings_problem(loc: tuple[int | str, ...], message: str) -> str:
    """A settings error as one line that names the variable."""
    message = message.removeprefix("Value error, ")
    variable = ".".join(str(part) for part in loc)
    return message if message.startswith(variable) else f"{variable}: {message}"


def _simulate(ns: argparse.Namespace) -> int:
    import time

    from services.simulate import SimConfig, simulate
    from services.simulate.send import send_events

    kwargs: dict[str, Any] = dict(
        ranks=ns.ranks, gpus=ns.gpus, hours=ns.hours, step_s=ns.step_seconds, mtbf_s=ns.mtbf or None,
        checkpoint_every=ns.checkpoint_every, checkpoint_s=ns.checkpoint_seconds, startup_s=ns.restart_seconds,
        detect_s=ns.detect_seconds, hang_at_step=ns.hang_at_step, hang_s=ns.hang_seconds,
        straggler_rank=ns.straggler_rank, straggler_factor=ns.straggler_factor, end=ns.end,
        max_failures=ns.max_failures, seed=ns.seed,
    )
    if ns.run_id:
        kwargs["run_id"] = ns.run_id
    result = simulate(SimConfig(**kwargs, start_time=ns.start_time or time.time()))
    if ns.start_time is None:  # shift so the simulated job ends now
        last = max(_event_end(e) for e in result.events)
        result = simulate(SimConfig(**kwargs, start_time=2 * time.time() - last))
    with _api(ns, write=True) as api:
        sent = send_events(api, result.events)
    print(f"run {result.config.run_id}: sent {len(result.events)} events ({sent.accepted} accepted, "
          f"{sent.duplicates} duplicates) to {api.base_url}")
    if ns.truth:
        print(json.dumps(result.truth.as_dict(), indent=2))
    return 0


def _event_end(event: dict[str, Any]) -> float:
    end = event.get("end")
    if isinstance(end, list):
        return float(max(end))
    return float(end if end is not None else event["time"])


def _runs(ns: argparse.Namespace) -> int:
    from services.cli.output import RunFilter, print_runs

    if ns.last is not None and ns.since is not None:
        print("goodput runs: give --since or --last, not both", file=sys.stderr)
        return 2
    if ns.limit is not None and ns.limit < 1:
        print(f"goodput runs: --limit must be at least 1, got {ns.limit}", file=sys.stderr)
        return 2
    if ns.last is not None:
        from services.presentation import duration_seconds

        try:
            duration_seconds(ns.last)
        except ValueError as exc:
            raise SystemExit(f"goodput runs: --last: {exc}") from None
    selection = RunFilter(project=ns.project, status=ns.status, since=_epoch(ns.since, "--since", "runs"),
                          until=_epoch(ns.until, "--until", "runs"), last=ns.last, run_id=ns.run_id_part,
                          limit=ns.limit)
    with _api(ns) as api:
        return print_runs(api, selection, as_json=ns.json)


def _ledger(ns: argparse.Namespace) -> int:
    from services.cli.output import print_ledger

    with _api(ns) as api:
        return print_ledger(api, ns.run_id, as_json=ns.json, project=ns.project)


def _failures(ns: argparse.Namespace) -> int:
    from services.cli.output import print_failures

    with _api(ns) as api:
        return print_failures(api, ns.run_id, as_json=ns.json, project=ns.project)


def _epoch(value: str | None, option: str, command: str = "report") -> float | None:
    """Epoch seconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    from datetime import UTC, datetime

    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise SystemExit(f"goodput {command}: {option} must be epoch seconds or an ISO 8601 time "
                         f"(2026-01-31 or 2026-01-31T12:00:00+00:00), got {value!r}") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _report(ns: argparse.Namespace) -> int:
    if ns.fleet == (ns.run_id is not None):
        print("goodput report: give a RUN_ID, or --fleet for every run", file=sys.stderr)
        return 2
    if ns.fleet and ns.format not in (None, "csv"):
        print("goodput report: --fleet writes CSV only", file=sys.stderr)
        return 2
    from services.reports.export import FLEET_FILENAME, report_filename

    format: Literal["json", "csv", "html"] = "csv" if ns.fleet else (ns.format or "html")
    with _api(ns) as api:
        if ns.fleet:
            document = api.fleet_report(since=_epoch(ns.since, "--since"), until=_epoch(ns.until, "--until"),
                                        status=ns.status, project=ns.project)
            what, default = "fleet report", FLEET_FILENAME
        else:
            document = api.report(ns.run_id, format=format, project=ns.project, self_contained=ns.self_contained)
            what, default = f"report of run {ns.run_id}", report_filename(ns.run_id, format)
    if ns.output == "-":
        sys.stdout.write(document.decode())
        return 0
    path = ns.output or default
    with open(path, "wb") as f:
        f.write(document)
    where = "" if ns.output else " in the current folder (-o FILE to choose, -o - for standard output)"
    print(f"wrote the {what} to {path}{where} ({len(document):,} bytes)", file=sys.stderr)
    return 0


def _advise(ns: argparse.Namespace) -> int:
    from services.cli.advice import print_advice

    with _api(ns) as api:
        return print_advice(api, ns.run_id, as_json=ns.json, project=ns.project)


def _simulate_interval(ns: argparse.Namespace) -> int:
    from services.cli.advice import print_interval_table

    for name in ("delta", "restart"):
        if getattr(ns, name) < 0:
            raise SystemExit(f"goodput simulate-interval: --{name} must be >= 0, got {getattr(ns, name)}")
    if ns.mtbf <= 0 or ns.work <= 0 or any(t <= 0 for t in ns.intervals):
        raise SystemExit("goodput simulate-interval: --mtbf, --work and --intervals must be positive")
    return print_interval_table(delta=ns.delta, mtbf=ns.mtbf, restart=ns.restart, work_hours=ns.work,
                                intervals=ns.intervals, replicates=ns.replicates, seed=ns.seed)


def _safe(engine: Engine) -> str:
    """The engine's database URL, without its password."""
    return engine.url.render_as_string(hide_password=True)

