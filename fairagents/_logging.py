"""fairagents' loggers, which write nothing unless the application asks for it.

A library never configures logging, and structlog unconfigured prints every event on
stdout. So each event goes through structlog once the application has configured it
(``structlog.configure``, as ``fairagents`` the command does), and through the standard
library's ``logging.getLogger(name)`` until then: an application that configures
nothing sees no events on stdout, and only warnings and errors on stderr (Python's
last-resort handler), the same as from any library that uses ``logging``.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["get_logger"]


class _Logger:
    """A logger that picks structlog or the standard library at each event, so configuring later works."""

    __slots__ = ("_name", "_stdlib")

    def __init__(self, name: str) -> None:
        self._name = name
        self._stdlib = structlog.wrap_logger(
            logging.getLogger(name),
            processors=[structlog.stdlib.filter_by_level, structlog.processors.KeyValueRenderer(key_order=["event"])],
            wrapper_class=structlog.stdlib.BoundLogger,
        )

    def __getattr__(self, method: str) -> Any:
        if structlog.is_configured():
            return getattr(structlog.get_logger(self._name), method)
        return getattr(self._stdlib, method)


def get_logger(name: str) -> Any:
    """The logger for fairagents' module ``name``: structlog's once configured, else ``logging``'s."""
    return _Logger(name)
