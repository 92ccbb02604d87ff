"""The views of the pool: ``/v1/fairness``, ``/metrics``, health, and the dashboard.

``/v1/fairness``, ``/metrics`` and ``/dashboard`` are read by whom
:data:`~fairagents.server.routes.Observer` admits; ``/health`` (readiness) and
``/health/live`` (liveness) by anyone.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from fairagents.server.dashboard import page
from fairagents.server.metrics import CONTENT_TYPE
from fairagents.server.routes import GatewayDep, Observer

__all__ = ["router"]

router = APIRouter()
"""The routes of the views."""


@router.get("/v1/fairness")
async def fairness(
    gateway: GatewayDep,
    viewer: Observer,
    history: Annotated[float | None, Query(ge=0, description="seconds of service history to include")] = None,
    app_name: Annotated[str | None, Query(alias="app", description="the app whose per-agent history to include "
                                                                    "(an app's own key: its own)")] = None,
) -> Response:
    body = await gateway.view.body(history, draining=gateway.draining, app=viewer or app_name, only=viewer)
    return Response(body, media_type="application/json")


@router.get("/metrics")
async def metrics(gateway: GatewayDep, _: Observer) -> Response:
    exposition = await gateway.metrics.exposition(gateway.config.server.views_cache_seconds)
    return Response(exposition, media_type=CONTENT_TYPE)


@router.get("/health")
async def health(gateway: GatewayDep) -> JSONResponse:
    """Readiness: 200 only while every model serves; 503 when one is down (or the server drains)."""
    models = {name: {"healthy": m["healthy"], "restarting": m["restarting"]} for name, m in gateway.models().items()}
    healthy = sum(m["healthy"] for m in models.values())
    if gateway.draining:
        status = "draining"
    else:
        status = "ok" if models and healthy == len(models) else ("degraded" if healthy else "down")
    body: dict[str, Any] = {"status": status, "models": models}
    if gateway.arbiter.counters is not None:  # a lost Redis is reported, not a reason to stop serving
        body["counters"] = {"connected": gateway.arbiter.counters.status()["connected"]}  # not where: /metrics has more
    return JSONResponse(body, 200 if status == "ok" else 503)


@router.get("/health/live")
async def live() -> JSONResponse:
    """Liveness: the process answers; a model that is down is not a reason to restart it."""
    return JSONResponse({"status": "live"})


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard(gateway: GatewayDep, _: Observer) -> HTMLResponse:
    return HTMLResponse(page(gateway.title), headers={"Cache-Control": "no-cache"})


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")
