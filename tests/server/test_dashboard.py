"""The live fairness page in headless Chromium: after traffic from two apps, it shows each app's bar."""

import asyncio
import re
import shutil

import httpx
import pytest

import fairagents as fa
from fairagents.constants import HEADER_APP
from fairagents.server import Config
from fairagents.testing import FakeEngine

from ._support import MSG, live

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--hide-scrollbars", "--window-size=1400,1000", "--virtual-time-budget=4000",
]
# the page's colours for the first two apps, in name order
COLORS = {"flood": (0xF2, 0x8E, 0x2B), "driving": (0x4E, 0x79, 0xA7)}


async def _chromium(*args):
    process = await asyncio.create_subprocess_exec(
        CHROMIUM, *FLAGS, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
async def test_the_dashboard_shows_each_app_s_share_after_traffic(tmp_path):
    from PIL import Image

    arbiter = fa.Arbiter(in_flight=2)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=10, token_time=0.002))
    async with live(arbiter, Config.model_validate({"server": {"auth": False}})) as (url, gateway):
        gateway.view.sample()
        async with httpx.AsyncClient(base_url=url) as http:

            async def caller(app, n):
                for _ in range(n):
                    response = await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG},
                                               headers={HEADER_APP: app})
                    assert response.status_code == 200

            await asyncio.gather(*(caller("flood", 6) for _ in range(8)), caller("driving", 12))
        gateway.view.sample()
        dom = await _chromium(f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom", f"{url}/dashboard")
        shot = tmp_path / "dashboard.png"
        await _chromium(f"--user-data-dir={tmp_path / 'profile-shot'}", f"--screenshot={shot}", f"{url}/dashboard")

    assert 'data-ready="1"' in dom and "policy hmfs" in dom
    shares = dict(re.findall(r'class="bar" data-app="([\w-]+)" data-share="([\d.]+)"', dom))
    assert set(shares) == {"driving", "flood"} and all(0 < float(s) < 1 for s in shares.values())
    assert abs(sum(map(float, shares.values())) - 1) < 1e-3
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 1000)
    counts = dict.fromkeys(COLORS, 0)
    for n, pixel in image.getcolors(image.width * image.height):
        for app, color in COLORS.items():
            if all(abs(p - c) <= 6 for p, c in zip(pixel, color, strict=True)):
                counts[app] += n
    assert all(n > 300 for n in counts.values()), counts  # each app's bar (and its area over time) is drawn
