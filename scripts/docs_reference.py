"""The documentation's reference pages, written from the code: settings, events, HTTP API, CLI, metrics.

    python scripts/docs_reference.py           # rewrite docs/reference/*.md
    python scripts/docs_reference.py --check   # exit 1, naming the pages, when a page differs from the code

Each page says where it comes from. ``tests/test_docs.py`` runs ``--check``: a setting, an event field, a route, a
flag or a metric added to the code without its page regenerated fails the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "docs" / "reference"
CODE_DIRS = ("services", "ingest_client", "dashboards")
ENV_NAME = re.compile(r"\bGOODPUT_[A-Z0-9_]*[A-Z0-9]\b")
HEADER = "<!-- Written by scripts/docs_reference.py from the code; edit the code, then run it. -->\n\n"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- settings -------------------------------------------------------------------------------------------------

def _shown(value: object) -> str:
    """A default as a user would write it."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, Path):
        home = Path.home()
        return "~/" + str(value.relative_to(home)) if value.is_relative_to(home) else str(value)
    return str(getattr(value, "value", value))


def _rst_to_markdown(text: str) -> str:
    return re.sub(r":(?:mod|func|class|meth):`([^`]+)`", r"`\1`", text).replace("``", "`")


def _client_settings() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) of every variable the client declares (ingest_client/common/config.py's
    docstring)."""
    from ingest_client.common import config

    defaults = {env: getattr(config.ClientConfig(), name) for name, env in config.ENV_VARS.items()}
    defaults["GOODPUT_MODE"] = "online with a URL, else offline"
    out = []
    for block in re.split(r"\n(?=``GOODPUT_)", (config.__doc__ or "").split("\n\n", 1)[1]):
        lines = block.split("\n\n", 1)[0].splitlines()  # an entry ends at a blank line
        names = re.findall(r"``(GOODPUT_[A-Z0-9_]+)``", lines[0])
        meaning = _rst_to_markdown(" ".join(line.strip() for line in lines[1:]))
        for name in names:
            out.append((f"`{name}`", _shown(defaults.get(name)), meaning.split(". Default")[0].rstrip(".") + "."))
    return out


def _service_settings() -> list[tuple[str, str, str, str]]:
    """(variable, default, section, meaning) of every field of services/settings.py."""
    from services import settings

    out = []
    for section in (settings.ServerSettings, settings.IngestSettings, settings.PlausibilitySettings,
                    settings.LiveSettings, settings.MetricsSettings, settings.DashboardSettings,
                    settings.ClientSettings):
        for field in section.model_fields.values():
            description = field.description or ""
            variable, _, meaning = description.partition(": ")
            out.append((f"`{variable}`", _shown(field.default), section.__name__.removesuffix("Settings").lower(),
                        meaning))
    return out


def _launcher_settings() -> list[tuple[str, str]]:
    """(variable, meaning) of the variables ``goodput launch`` and the client set for each other."""
    from ingest_client.common import config

    return [(f"`{name}`", meaning) for name, meaning in config.INTERNAL_ENV_VARS.items()]


def settings_page() -> str:
    client = _client_settings()
    service = _service_settings()
    internal = _launcher_settings()
    return (HEADER + "# Settings\n\n"
            "Every `GOODPUT_*` variable: the client's (read by `ingest_client` inside each training process, from "
            "`ingest_client/common/config.py`), the services' (the collector, the CLI and the dashboard, from "
            "`services/settings.py`), and the ones the launcher and the client set for each other. An argument "
            "given in code or on the command line wins over the variable; an empty variable counts as unset.\n\n"
            "## Client (training processes)\n\n"
            + _table(("variable", "default", "meaning"), list(client))
            + "\n## Services (collector, CLI, dashboard)\n\n"
            "The section says which process reads it: `server`, `ingest`, `plausibility`, `live` and `metrics` the "
            "collector (`goodput serve`), `dashboard` a standalone dashboard, `client` the CLI's commands that talk "
            "to a collector.\n\n"
            + _table(("variable", "default", "section", "meaning"), list(service))
            + "\n## Set by goodput for its own processes\n\n"
            "Not for users to set: `goodput launch` and the client pass these to the processes they start.\n\n"
            + _table(("variable", "meaning"), list(internal)))


def declared_variables() -> set[str]:
    names = ([name for name, _, _ in _client_settings()] + [name for name, _, _, _ in _service_settings()]
             + [name for name, _ in _launcher_settings()])
    return {name.strip("`") for name in names}


def variables_in_code() -> dict[str, list[str]]:
    """Every GOODPUT_* name written in the packages' code, with the files that write it."""
    found: dict[str, list[str]] = {}
    for directory in CODE_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            for name in set(ENV_NAME.findall(path.read_text())):
                found.setdefault(name, []).append(str(path.relative_to(REPO)))
    return found


# -- events -----------------------------------------------------------------------------------------------------

def _json_type(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in schema:
        return _json_type(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in schema:
        kinds = [_json_type(s, defs) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(kinds)
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"[{_json_type(schema.get('items', {}), defs)}]"
    bounds = [f"{word} {schema[key]}" for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                        ("maximum", "<="), ("minLength", "length >="),
                                                        ("maxLength", "length <=")) if key in schema]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def events_page() -> str:
    from services.schemas.events import EVENT_KINDS, EventBatch

    schema = EventBatch.model_json_schema()
    defs = schema.get("$defs", {})
    by_kind = {}
    for definition in defs.values():
        kind = definition.get("properties", {}).get("kind", {}).get("const")
        if kind:
            by_kind[kind] = definition
    parts = [HEADER, "# Event schema\n\n",
             "The fields of each event kind as the collector validates them (`services/schemas/events.py`; "
             "what they mean: [the wire format](../events.md)). Every event also carries `event_id`, `run_id`, "
             "`kind` and `time`; unknown fields are refused.\n\n"]
    for kind in EVENT_KINDS:
        definition = by_kind[kind]
        required = set(definition.get("required", ()))
        rows: list[tuple[object, ...]] = []
        for name, prop in definition["properties"].items():
            if name in ("event_id", "run_id", "kind", "time"):
                continue
            rows.append((f"`{name}`", _json_type(prop, defs), "yes" if name in required else "no"))
        parts.append(f"## `{kind}`\n\n")
        parts.append(_table(("field", "type", "required"), rows) if rows else "No fields beyond the common ones.\n")
        parts.append("\n")
    return "".join(parts).rstrip() + "\n"


# -- HTTP API ---------------------------------------------------------------------------------------------------

def _openapi() -> dict[str, Any]:
    from services.collector.app import create_app
    from services.settings import ServerSettings, ServiceSettings

    settings = ServiceSettings(server=ServerSettings(database_url="sqlite://", serve_dashboard=False,
                                                     warm_analyses_s=0))
    with contextlib.redirect_stderr(io.StringIO()):
        return create_app(settings).openapi()


def api_page() -> str:
    spec = _openapi()
    parts = [HEADER, "# HTTP API\n\n",
             "Every route of the collector, from its OpenAPI document (`GET /openapi.json`; interactive at `/docs` "
             "on a running collector). Reads take a read token, writes a write token, when the collector has "
             "tokens (see the security guide).\n\n"]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            parts.append(f"## `{method.upper()} {path}`\n\n")
            summary = op.get("summary", "")
            description = (op.get("description") or "").strip()
            parts.append(f"{summary}.\n\n" if summary and not description else "")
            parts.append(description + "\n\n" if description else "")
            params = [(f"`{p['name']}`", p["in"], _json_type(p.get("schema", {}), spec.get("components", {})
                                                             .get("schemas", {})),
                       "yes" if p.get("required") else "no", p.get("description", ""))
                      for p in op.get("parameters", [])]
            if params:
                parts.append(_table(("parameter", "in", "type", "required", "meaning"), params) + "\n")
            responses = [(code, r.get("description", "")) for code, r in op.get("responses", {}).items()]
            parts.append(_table(("status", "meaning"), responses) + "\n")
    return "".join(parts).rstrip() + "\n"


# -- CLI --------------------------------------------------------------------------------------------------------

def _commands() -> Iterator[list[str]]:
    """Every command path of `goodput` (the parser's subcommands, depth first)."""
    from services.cli.main import _parser

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[list[str]]:
        yield path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])

    yield from walk(_parser(), [])


def _help(path: list[str]) -> str:
    from services.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*path, "--help"])
    return out.getvalue().rstrip()


def cli_page() -> str:
    parts = [HEADER, "# Command line\n\n",
             "`goodput` and its commands, as `--help` prints them (`services/cli/`, "
             "`ingest_client/launcher/launch.py`, `ingest_client/tools/sync.py`).\n\n"]
    for path in _commands():
        parts.append(f"## `{' '.join(['goodput', *path])}`\n\n```text\n{_help(path)}\n```\n\n")
    return "".join(parts).rstrip() + "\n"


# -- metrics ----------------------------------------------------------------------------------------------------

def metrics_page() -> str:
    from services.metrics.collectors import RunMetricsCollector
    from services.metrics.instruments import CollectorInstruments
    from services.metrics.snapshot import Snapshot

    empty = Snapshot(taken_at=0.0, runs=(), labelled=0, window_runs_without_ledger=0, duration_s=0.0)
    registry = CollectorInstruments.create().scrape_registry(RunMetricsCollector(lambda: empty, lambda: 0.0))
    rows = []
    for family in sorted(registry.collect(), key=lambda f: f.name):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = sorted({label for sample in family.samples for label in sample.labels if label != "le"})
        rows.append((f"`{name}`", family.type, ", ".join(f"`{label}`" for label in labels), family.documentation))
    return (HEADER + "# Prometheus metrics\n\n"
            "What `GET /metrics` exposes (`services/metrics/`). Run series (`goodput_run_*`) are labelled by "
            "`run_id` and `project` for the runs in the window (running first, at most GOODPUT_METRICS_MAX_RUNS); "
            "labels of series that have no sample on an empty collector are not listed here (see each metric's "
            "text).\n\n" + _table(("metric", "type", "labels", "meaning"), rows))


PAGES: dict[str, Callable[[], str]] = {
    "settings.md": settings_page, "events.md": events_page, "api.md": api_page, "cli.md": cli_page,
    "metrics.md": metrics_page,
}


def render() -> dict[str, str]:
    os.environ["COLUMNS"] = "110"  # argparse wraps --help to the terminal's width: one width, every machine
    return {name: page() for name, page in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the code says")
    args = parser.parse_args(argv)
    pages = render()
    if args.check:
        stale = [name for name, text in pages.items()
                 if not (OUT / name).exists() or (OUT / name).read_text() != text]
        undeclared = sorted(set(variables_in_code()) - declared_variables())
        if stale:
            print(f"docs/reference is stale: {', '.join(stale)}; run: python scripts/docs_reference.py")
        if undeclared:
            print(f"GOODPUT_ variables in the code but in no settings table: {', '.join(undeclared)}")
        return 1 if stale or undeclared else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
