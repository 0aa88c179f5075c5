"""Shared dependencies of the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from services.settings import ServiceSettings
from services.storage.writer import BatchWriter


def _engine(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


def _writer(request: Request) -> BatchWriter:
    return request.app.state.writer  # type: ignore[no-any-return]


def _settings(request: Request) -> ServiceSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


EngineDep = Annotated[Engine, Depends(_engine)]
WriterDep = Annotated[BatchWriter, Depends(_writer)]
SettingsDep = Annotated[ServiceSettings, Depends(_settings)]
