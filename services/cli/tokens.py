"""`goodput token create | list | revoke`: access tokens, managed on the collector's database directly.

Run on the collector's host (or anywhere that reaches its database): the token is printed once and only its
salted hash is stored. The CLI's own read commands (`goodput runs`, `ledger`, `report`, `advise`) send a read
token from GOODPUT_READ_TOKEN.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from services.presentation import timestamp


def add_token_parser(sub: Any, db_help: str) -> None:  # Any: argparse's subparsers action type is private
    token = sub.add_parser("token", help="access tokens: create, list, revoke (on the collector's database)")
    actions = token.add_subparsers(metavar="ACTION")
    create = actions.add_parser("create", help="create a token and print it (once)")
    create.add_argument("--project", required=True,
                        help="the project it writes or reads; '*' = every project (read tokens only)")
    create.add_argument("--kind", choices=["write", "read"], required=True,
                        help="write: the training jobs' GOODPUT_TOKEN; read: API, reports, metrics, dashboard")
    create.add_argument("--name", help="a note: who or what uses it")
    create.add_argument("--db", help=db_help)
    create.set_defaults(handler=_create)
    listing = actions.add_parser("list", help="every token: id, kind, project, name, created, revoked (no secrets)")
    listing.add_argument("--db", help=db_help)
    listing.set_defaults(handler=_list)
    revoke = actions.add_parser("revoke", help="revoke a token by its id (the 12 hex digits in gpw_<id>_...)")
    revoke.add_argument("token_id")
    revoke.add_argument("--db", help=db_help)
    revoke.set_defaults(handler=_revoke)
    token.set_defaults(handler=lambda ns: token.print_help() or 2)


def _engine(ns: argparse.Namespace) -> Any:  # Any: sqlalchemy is imported lazily
    from services.settings import ServerSettings
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    engine = make_engine(ns.db or ServerSettings().database_url)
    upgrade(engine)
    return engine


def _create(ns: argparse.Namespace) -> int:
    from services.storage.tokens import create_token

    engine = _engine(ns)
    try:
        with engine.begin() as conn:
            token, info = create_token(conn, kind=ns.kind, project=ns.project, name=ns.name)
    except ValueError as exc:
        print(f"goodput token create: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    use = ("export GOODPUT_TOKEN=<it> in the training jobs" if info.kind == "write" else
           "send it as 'Authorization: Bearer <it>' (or as the dashboard's password; GOODPUT_READ_TOKEN for the CLI)")
    print(token)
    print(f"created {info.kind} token {info.token_id} for project {info.project!r}; it is shown only now: "
          f"store it, then {use}. Collectors accept it within GOODPUT_AUTH_CACHE_TTL_S (5 s).", file=sys.stderr)
    return 0


def _list(ns: argparse.Namespace) -> int:
    from services.storage.tokens import list_tokens

    engine = _engine(ns)
    try:
        with engine.connect() as conn:
            tokens = list_tokens(conn)
    finally:
        engine.dispose()
    if not tokens:
        print("no tokens: the collector accepts only localhost clients (goodput token create --help)")
        return 0
    print(f"{'id':<12}  {'kind':<5}  {'project':<20}  {'created (UTC)':<19}  {'revoked (UTC)':<19}  name")
    for t in tokens:
        print(f"{t.token_id:<12}  {t.kind:<5}  {t.project[:20]:<20}  {timestamp(t.created_at):<19}  "
              f"{timestamp(t.revoked_at):<19}  {t.name or ''}")
    return 0


def _revoke(ns: argparse.Namespace) -> int:
    from services.storage.tokens import revoke_token

    engine = _engine(ns)
    try:
        with engine.begin() as conn:
            done = revoke_token(conn, ns.token_id)
    finally:
        engine.dispose()
    if not done:
        print(f"goodput token revoke: no active token {ns.token_id!r} (goodput token list)", file=sys.stderr)
        return 1
    print(f"revoked {ns.token_id}; collectors refuse it within GOODPUT_AUTH_CACHE_TTL_S (5 s)")
    return 0
