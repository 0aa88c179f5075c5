"""Schemathesis against the collector's own OpenAPI schema: every operation, valid and invalid inputs, no 5xx.

Each operation gets three passes with a fixed budget and derandomized generation: schema-valid requests,
schema-violating requests, and valid requests aimed at a seeded run (a simulated job with restarts, a hang and
a straggler) so the run-scoped reads go past their 404.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Err, Ok

from services.collector.app import create_app
from services.settings import IngestSettings, ServerSettings, ServiceSettings
from services.simulate import SimConfig, simulate
from tests.fuzz.conftest import CASES, budget

SEEDED_RUN = "fuzz-seeded"
PASSES = (("valid", GenerationMode.POSITIVE, False, 20), ("invalid", GenerationMode.NEGATIVE, False, 20),
          ("seeded run", GenerationMode.POSITIVE, True, 10))


@pytest.fixture
def app(database_url: str, engine) -> Iterator[FastAPI]:
    app = create_app(ServiceSettings(server=ServerSettings(database_url=database_url, serve_dashboard=False),
                                     ingest=IngestSettings(max_body_bytes=1 << 20)),
                     engine=engine)
    result = simulate(SimConfig(run_id=SEEDED_RUN, ranks=4, hours=0.05, step_s=1.0, mtbf_s=60.0,
                                checkpoint_every=20, checkpoint_s=2.0, startup_s=5.0, detect_s=3.0,
                                hang_at_step=40, hang_s=10.0, straggler_rank=1, end="running",
                                start_time=1_700_000_000.0, seed=1))
    with TestClient(app) as c:
        assert c.post("/v1/events", json={"events": result.events}).status_code == 200
        yield app


def test_no_operation_answers_a_server_error(app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    results = list(schema.get_all_operations())
    assert not [r.err() for r in results if isinstance(r, Err)]
    operations = [r.ok() for r in results if isinstance(r, Ok)]
    assert len(operations) >= 15, [op.label for op in operations]
    failures: list[str] = []
    for operation in operations:
        has_run = "{run_id}" in operation.path
        for name, mode, seeded, examples in PASSES:
            if seeded and not has_run:
                continue
            strategy = operation.as_strategy(generation_mode=mode,
                                             path_parameters={"run_id": SEEDED_RUN} if seeded else None)
            _fuzz(operation.label, name, strategy, budget(examples), failures)
    assert not failures, "\n".join(failures[:20])


def _fuzz(label: str, name: str, strategy: Any, examples: int, failures: list[str]) -> None:
    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case: Any) -> None:
        CASES[f"schemathesis {label} ({name})"] += 1
        response = case.call()
        if response.status_code >= 500:
            failures.append(f"{label} ({name}): {response.status_code} {response.text[:300]} for "
                            f"path={case.path_parameters} query={case.query} body={str(case.body)[:200]}")

    with contextlib.suppress(Unsatisfiable):  # nothing schema-violating to send (e.g. a lone string path parameter)
        run()
