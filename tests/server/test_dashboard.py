"""The live fairness page in headless Chromium: it shows each app's bar, and marks whose demand is met."""

import asyncio
import colorsys
import re
import shutil

import httpx
import pytest

import fairagents as fa
from fairagents.constants import HEADER_APP
from fairagents.server import Config
from fairagents.testing import FakeEngine

from ._support import MSG, live, wait_until

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--hide-scrollbars", "--window-size=1400,1000", "--virtual-time-budget=4000",
]
# the page's colours for the first two apps, in name order
COLORS = {"flood": (0xF2, 0x8E, 0x2B), "driving": (0x4E, 0x79, 0xA7)}
# the page's card background (light and dark scheme), and the opacity of the areas over time drawn on it
CARDS, AREA_OPACITY = ((0xFF, 0xFF, 0xFF), (0x17, 0x1D, 0x23)), 0.85


def _drawn(color):
    """The colour in full (a backlogged app's bar), and as the areas over time show it on either card."""
    return [color, *(tuple(AREA_OPACITY * c + (1 - AREA_OPACITY) * b for c, b in zip(color, card, strict=True)) for card in CARDS)]


async def _chromium(*args):
    process = await asyncio.create_subprocess_exec(
        CHROMIUM, *FLAGS, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


def test_the_page_renders_demand_met_and_backlogged():
    from fairagents.server.dashboard import page

    html = page()
    assert "s.demand_met" in html and '"demand met"' in html and '"backlogged"' in html
    assert "s.below_entitlement" in html and "s.active" in html and "weight_share" not in html  # the server's rule
    assert 'data-demand="${d.cls}"' in html and 'opacity="${d.opacity}"' in html  # on the bars
    assert "pct(s.backlogged)" in html  # in the table


def test_red_means_a_shortfall_and_never_an_app():
    """The apps' colours keep clear of the alert colour (and of red, pink and the healthy green altogether)."""
    from fairagents.server.dashboard import page

    html = page()
    palette = re.search(r"const PALETTE = \[([^\]]+)\]", html).group(1)
    colors = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in re.findall(r'"(#[0-9a-f]{6})"', palette)]
    bad, ok = (re.search(rf"--{name}:(#[0-9a-f]{{6}})", html).group(1) for name in ("bad", "ok"))
    assert len(colors) == 10 and bad not in palette and ok not in palette
    for color in colors:
        hue = 360 * colorsys.rgb_to_hsv(*(c / 255 for c in color))[0]
        assert 15 < hue < 330 and not 80 < hue < 160, (color, hue)  # no red or pink, no green


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
    assert re.findall(r'class="bar" data-app="(\w+)" data-share="[\d.]+" data-demand="met"', dom) == ["driving", "flood"]  # all ended
    assert re.findall(r'class="agent device-app" data-device="(\w+)" data-app="(\w+)"', dom) == [
        ("local", "driving"), ("local", "flood")]  # the one device, and each app's share of it
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 1000)
    counts = dict.fromkeys(COLORS, 0)
    for n, pixel in image.getcolors(image.width * image.height):
        for app, color in COLORS.items():
            if any(all(abs(p - c) <= 6 for p, c in zip(pixel, drawn, strict=True)) for drawn in _drawn(color)):
                counts[app] += n
    assert all(n > 300 for n in counts.values()), counts  # each app's area over time is drawn (its bar is muted now)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
async def test_the_dashboard_marks_an_app_whose_demand_is_met(tmp_path):
    """driving's one request runs, nothing of it waits: demand met, muted; flood waits below its entitlement;
    spare is declared and sends nothing: idle, muted, and left out of the entitlements."""
    engine = FakeEngine(manual=True)
    arbiter = fa.Arbiter(in_flight=2)
    arbiter.add_model("chat", engine)
    config = Config.model_validate({"server": {"auth": False}, "apps": {"spare": {}}})
    async with live(arbiter, config) as (url, gateway):
        gateway.view.max_age = 0
        async with httpx.AsyncClient(base_url=url) as http:

            def call(app):
                body = {"model": "chat", "messages": MSG, "max_tokens": 20}
                return asyncio.create_task(http.post("/v1/chat/completions", json=body, headers={HEADER_APP: app}))

            calls = [call("driving")]
            await wait_until(lambda: len(engine.running) == 1)
            [first] = engine.running
            engine.emit(first, 10)  # driving has been served more than flood will be
            calls += [call("flood") for _ in range(4)]
            await wait_until(lambda: len(engine.running) == 2 and arbiter.policy.queued() == 3)
            apps = arbiter.stats().apps
            assert apps["flood"].share < apps["flood"].weight_share and apps["driving"].queued == 0
            dom = await _chromium(f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"{url}/dashboard")
            ended: set[str] = set()
            while not all(c.done() for c in calls):
                for request_id in set(engine.running) - ended:
                    engine.emit(request_id, 1, finish="stop")
                    ended.add(request_id)
                await asyncio.sleep(0.005)
            assert all(r.status_code == 200 for r in await asyncio.gather(*calls))

    assert 'data-ready="1"' in dom
    bar = r'class="bar( short)?" data-app="(\w+)" data-share="[\d.]+" data-demand="(\w+)"[^>]* opacity="([\d.]+)"'
    assert {app: (short, demand, opacity) for short, app, demand, opacity in re.findall(bar, dom)} == {
        "driving": ("", "met", "0.35"), "flood": (" short", "under", "1"), "spare": ("", "idle", "0.35")}
    label = r'class="demand (\w+)" data-app="(\w+)">([^<]+)<'
    assert {app: (cls, text) for cls, app, text in re.findall(label, dom)} == {
        "driving": ("met", "demand met"), "flood": ("under", "▼ below entitlement"), "spare": ("idle", "idle")}
    # entitled among the two active apps, not the three declared; the idle one has no entitlement line
    assert dict(re.findall(r'data-app="(\w+)" data-entitled="([\d.]*)"', dom)) == {
        "driving": "0.5", "flood": "0.5", "spare": ""}
    assert sorted(re.findall(r'class="entitled" data-app="(\w+)"', dom)) == ["driving", "flood"]
    rows = re.findall(r'<tr class="app"><td>(\w+)</td>.*?<td class="(\w+)" title="[^"]*">([^<]+)</td>', dom)
    assert rows == [
        ("driving", "met", "demand met"), ("flood", "under", "▼ below entitlement"), ("spare", "idle", "idle")]


def test_the_page_has_a_devices_table():
    from fairagents.server.dashboard import page

    html = page()
    assert 'id="devices"' in html and "drawDevices(data)" in html and "s.entitled_share" in html


def test_the_page_has_a_runs_table():
    from fairagents.server.dashboard import page

    html = page()
    assert 'id="runs"' in html and "drawRuns(data)" in html
    assert "r.duration_seconds.p95" in html and "r.completed" in html and "r.active" in html


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
async def test_the_dashboard_lists_each_app_s_runs(tmp_path):
    arbiter = fa.Arbiter(in_flight=2)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=3))
    apps = {"news": {"agents": {"writer": {}}}, "quiet": {}}
    config = Config.model_validate({"server": {"auth": False}, "apps": apps})
    async with live(arbiter, config) as (url, _):

        def write(**run):
            return arbiter.chat("chat", MSG, agent="news/writer", max_tokens=4, **run)

        for _ in range(2):
            with arbiter.run():
                await asyncio.gather(write(), write())
        await write(run="open")
        dom = await _chromium(f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"{url}/dashboard")
    assert 'data-ready="1"' in dom
    rows = re.findall(r'<tr class="app run" data-app="(\w+)"><td>\w+</td><td>(\d+)</td><td>(\d+)</td>', dom)
    assert rows == [("news", "2", "1")]  # quiet has no runs: no row
