"""Multi-modal serving on real engines: preprocessing isolation, and what unified tokens count.

Two measurements, on the embedded text, vision and image models (or the engines given):

1. **Preprocessing isolation** (DuetInfer). A text app sends ``text_requests`` requests
   of ``text_tokens`` output tokens, one every 50 ms (open loop), while another app sends
   ``images`` requests over the same window, each carrying a large image (``image_side``
   pixels square, PNG). TTFT is measured as the caller sees it, from the moment it meant
   to send, so time the event loop spent blocked counts. Reported: the text requests'
   p50/p99 TTFT with no image load, with the load prepared in the preprocessing pool,
   and with the load prepared inline on the event loop (the layout the pool replaces).
2. **Cross-modal shares.** Three apps of equal weight, each backlogged on one modality
   (text chat, vision chat with a small image, image generation), on models that share
   ``pool`` in-flight slots (``Arbiter(pool_in_flight=pool)``: the apps compete for one
   capacity), for ``seconds``, under ``hmfs`` (unified tokens) and ``vtc`` (raw tokens).
   Per app, over the run less its first fifth: raw tokens charged (input ×1, output ×2:
   VTC's currency), unified tokens charged, requests ended, and slot-seconds (the time
   its requests held pool slots: the compute time it was given, as far as the arbiter
   decides it). Reported with each column's spread, ``(max − min) / mean`` across the
   apps.

What the second table shows: the scheduler equalises the currency it counts. Under
``hmfs`` the three apps' unified tokens agree; under ``vtc`` their raw tokens do, and a
denoising step's hundreds of latent tokens count like LLM tokens. Neither equalises
slot-seconds: on models this small, fixed per-step overhead, not width × depth,
dominates wall time, so a unified token is not the same compute on each model here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from rich.table import Table

from fairagents.runtime.arbiter import Arbiter
from fairagents.engines import embedded_pool
from fairagents.metrics import percentile

__all__ = ["POLICIES", "render", "run"]

POLICIES = ("hmfs", "vtc")
APPS = ("text-app", "vision-app", "image-app")
MODEL_OF = {"text-app": "text", "vision-app": "vision", "image-app": "image"}
WARMUP = 0.2  # the first fifth of a run is left out of the shares
TEXT = [{"role": "user", "content": "Summarise the state of the road network in three sentences."}]


def _noise_png(side: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    from fairagents.images import to_png

    rng = np.random.default_rng(seed)
    return to_png(Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)))


async def _scheduled(n: int, interval: float, call: Any) -> list[Any]:
    """Open loop: call ``call(i)`` at ``start + i · interval``, whatever the loop is doing; gather the results."""
    start = time.perf_counter()

    async def one(i: int) -> Any:
        due = start + i * interval
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        return await call(due)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def _isolation(engines: dict[str, Any], mode: str, pngs: list[bytes], images: int, text_requests: int,
                     text_tokens: int) -> dict[str, float]:
    arbiter = Arbiter(preprocess_inline=mode == "inline", preprocess_workers=1)
    arbiter.add_model("text", engines["text"])
    arbiter.add_model("vision", engines["vision"], in_flight=1)  # the image flood's compute stays small
    await arbiter.start()
    writer, eye = arbiter.app("text-app").agent("writer"), arbiter.app("vision-app").agent("eye")

    async def text(due: float) -> float:
        # TTFT as the caller sees it, from when it meant to send: a blocked event loop counts
        async for delta in writer.stream_chat("text", TEXT, max_tokens=text_tokens, ignore_eos=True):
            if delta.new_tokens:
                return time.perf_counter() - due
        return float("nan")

    async def image(due: float) -> None:
        png = pngs[int(due * 1e3) % len(pngs)]
        await eye.chat("vision", [{"role": "user", "content": [{"type": "image", "image": png}]}], max_tokens=1)

    interval = 0.05
    try:
        await _scheduled(3, interval, text)  # warm up
        flood = asyncio.gather() if mode == "unloaded" else asyncio.gather(
            _scheduled(images, interval * text_requests / images, image)
        )
        ttfts = await _scheduled(text_requests, interval, text)
        await flood
    finally:
        await arbiter.close(stop_engines=False)
    return {"ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99), "requests": len(ttfts)}


async def _shares(engines: dict[str, Any], policy: str, seconds: float, pool: int, png: bytes) -> dict[str, Any]:
    arbiter = Arbiter(policy=policy, pool_in_flight=pool)
    for name, engine in engines.items():
        arbiter.add_model(name, engine)
    await arbiter.start()
    start = time.monotonic()
    window = (start + WARMUP * seconds, start + seconds)  # every app backlogged throughout
    vision_msg = [{"role": "user", "content": [{"type": "image", "image": png}, {"type": "text", "text": "describe"}]}]

    async def caller(app: str) -> None:
        who = arbiter.app(app).agent("bot")
        while time.monotonic() < window[1]:
            if app == "text-app":
                await who.chat("text", TEXT, max_tokens=32, ignore_eos=True)
            elif app == "vision-app":
                await who.chat("vision", vision_msg, max_tokens=32, ignore_eos=True)
            else:
                await who.generate_image("image", "a red square on a blue field", size=(64, 64), steps=8)

    try:
        # more callers per app than the pool has slots: no app ever runs out of waiting requests
        await asyncio.gather(*(caller(app) for app in APPS for _ in range(pool + 1)))
    finally:
        await arbiter.close(stop_engines=False)
    lo, hi = window
    apps = {app: {"requests": 0.0, "raw_tokens": 0.0, "unified_tokens": 0.0, "slot_seconds": 0.0} for app in APPS}
    for r in arbiter.ledger.records:
        row = apps[r.app]
        if r.dispatched is not None and r.dispatched < hi and r.finished > lo:
            row["slot_seconds"] += min(r.finished, hi) - max(r.dispatched, lo)
        if lo <= r.finished <= hi:
            row["requests"] += 1
    for c in arbiter.ledger.charges:
        if lo <= c.time <= hi:
            apps[c.app]["unified_tokens"] += c.amount
    for app, row in apps.items():  # one model per app: its charges in raw tokens are unified / the model's scale
        row["raw_tokens"] = row["unified_tokens"] / arbiter.cost.scale(MODEL_OF[app])
    columns = ("raw_tokens", "unified_tokens", "slot_seconds")
    spread = {key: _spread([row[key] for row in apps.values()]) for key in columns}
    return {"apps": apps, "spread": spread, "window_s": hi - lo}


def _spread(values: list[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return (max(values) - min(values)) / mean if mean else 0.0


def run(
    engines: dict[str, Any] | None = None,
    *,
    images: int = 40,
    image_side: int = 1400,
    text_requests: int = 20,
    text_tokens: int = 4,
    seconds: float = 30.0,
    pool: int = 3,
) -> dict[str, Any]:
    """Run both measurements; ``engines`` maps ``"text"``, ``"vision"``, ``"image"`` to started-or-not engines.

    Unset, the embedded models are served (and stopped at the end).
    """

    async def main() -> dict[str, Any]:
        own = engines is None
        served = engines or embedded_pool()
        await asyncio.gather(*(e.start() for e in served.values()))
        try:
            pngs = [_noise_png(image_side, seed) for seed in range(4)]
            isolation = {
                mode: await _isolation(served, mode, pngs, images, text_requests, text_tokens)
                for mode in ("unloaded", "pool", "inline")
            }
            small = _noise_png(64, 0)
            shares = {policy: await _shares(served, policy, seconds, pool, small) for policy in POLICIES}
        finally:
            if own:
                for engine in served.values():
                    with contextlib.suppress(Exception):
                        await engine.stop()
        return {
            "load": {"images": images, "image_side": image_side, "text_requests": text_requests,
                     "text_tokens": text_tokens, "seconds": seconds, "pool": pool},
            "isolation": isolation,
            "shares": shares,
        }

    return asyncio.run(main())


def render(result: dict[str, Any]) -> list[Table]:
    """Two tables: text TTFT under image load, and the cross-modal shares."""
    load = result["load"]
    first = Table(title=f"Text TTFT while {load['images']} requests with {load['image_side']}² PNG images "
                        f"are preprocessed ({load['text_requests']} text requests × {load['text_tokens']} tokens)")
    for column in ("image preprocessing", "text TTFT p50", "text TTFT p99"):
        first.add_column(column, justify="right")
    labels = {"unloaded": "no image load", "pool": "in its pool (default)", "inline": "inline on the event loop"}
    for mode, r in result["isolation"].items():
        first.add_row(labels[mode], f"{r['ttft_p50_s'] * 1e3:.0f} ms", f"{r['ttft_p99_s'] * 1e3:.0f} ms")
    second = Table(title=f"Three apps of equal weight, each backlogged on one modality, sharing {load['pool']} "
                         f"in-flight slots for {load['seconds']:.0f} s")
    for column in ("policy", "app", "requests", "raw tokens (in + 2·out)", "unified tokens", "slot-seconds"):
        second.add_column(column, justify="right")
    for policy, r in result["shares"].items():
        for app, row in r["apps"].items():
            second.add_row(policy, app, f"{row['requests']:.0f}", f"{row['raw_tokens']:,.0f}",
                           f"{row['unified_tokens']:,.1f}", f"{row['slot_seconds']:.1f}")
        s = r["spread"]
        second.add_row(policy, "spread", "", f"{s['raw_tokens']:.1%}", f"{s['unified_tokens']:.1%}",
                       f"{s['slot_seconds']:.1%}", end_section=True)
    second.caption = "over the run less its first fifth; spread = (max − min) / mean across the three apps"
    return [first, second]
