"""Large answers serialized once: a route that returns the model itself has FastAPI dump it to Python objects,
validate those against the response model and serialize them again. For the fleet window's 3,000 runs that was
about a second (benchmarks.fleet_listing); pydantic writes the same JSON from the model directly."""

from __future__ import annotations

from fastapi import Response
from pydantic import BaseModel


def model_response(model: BaseModel) -> Response:
    """`model` as the JSON body of a 200 answer (the route keeps its `response_model` for the API's schema)."""
    return Response(content=model.model_dump_json(by_alias=True), media_type="application/json")
