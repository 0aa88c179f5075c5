"""The documents the system serves and accepts, and nothing else: pydantic models and the vocabulary they use.

A leaf: its modules import pydantic and the standard library only (tests/test_import_boundaries.py), so that a
client of the API (services.api_client, the dashboards, the CLI) reads them without loading the analysis, numpy
or pandas. Each model is defined once, here; the layers that build or serve it import it from here and re-export
nothing.

- events: the wire events of `POST /v1/events` (docs/events.md); their storage mapping is the collector's
  (services.collector.records)
- categories: the waste categories and run statuses (stored and served string values)
- ledger, usage, clocks: the ledger and what it is made of
- views, run_view, ranks: the run page's views, the view as served, one rank's drill-down
- live: hang detection, preemption cost, checkpoint requests
- advice, stragglers, resume: what to change, the straggler report, the resume check
- runs, fleet, status: the run list and detail, the fleet window, health and whoami
- errors: the error envelope every route shares, and the acknowledgement of ingest is events.IngestAck
"""
