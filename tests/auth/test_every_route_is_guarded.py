"""Every API route carries an access check, and every route of one run checks the run's project: a route added
later without one fails here, not in production. POST /v1/events is not a FastAPI route (it answers before the
router, services/collector/routes/ingest.py) and checks access itself: tests/auth/test_tokens_and_scoping.py posts
to it without a token, with a read token and with a revoked one."""

from __future__ import annotations

from fastapi.routing import APIRoute

from services.collector import auth
from services.collector.app import create_app
from services.settings import ServerSettings, ServiceSettings

RUN_CHECKS = {auth.readable_run, auth.writable_run, auth.client_run}
ANY_CHECK = RUN_CHECKS | {auth.caller, auth.write_caller, auth.read_caller, auth.fleet_read_caller, auth.network_rule,
                          auth.run_scope}


def _calls(dependant) -> set[object]:
    out = set()
    for dep in dependant.dependencies:
        out.add(dep.call)
        out |= _calls(dep)
    return out


def _flat(routes):
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI keeps included routers as one entry
        yield from _flat(inner.routes) if inner is not None else (route,)


def test_every_api_route_checks_access_and_every_run_route_checks_the_project() -> None:
    app = create_app(ServiceSettings(server=ServerSettings(database_url="sqlite://", serve_dashboard=False)))
    routes = [r for r in _flat(app.routes) if isinstance(r, APIRoute)]
    assert len(routes) >= 15
    for route in routes:
        calls = _calls(route.dependant)
        assert calls & ANY_CHECK, f"{route.path} has no access check (services/collector/auth.py)"
        if "{run_id" in route.path:
            assert calls & RUN_CHECKS, (f"{route.path} does not resolve the run for the caller: take it as "
                                        "RunDep (or WriteRunDep, ClientRunDep: services/collector/deps.py)")
