"""The live fairness page, ``GET /dashboard``: one self-contained HTML file, no network but the server.

It polls ``/v1/fairness`` every two seconds and draws, per app: its share of service
over the last 30 seconds against the share its weight entitles it to among the active
apps (and its share since start), the shares over the last five minutes as a stacked
area with the entitlements as dashed lines, each app's agents against their weights
among the active agents, a table of queues and latencies, and a table of each app's
runs of agent workflows (completed, active, mean and 95th percentile duration, mean
calls and service). An app or agent that is
idle (nothing queued, running or served in the last 30 seconds) is muted and labelled
"idle"; one whose demand is met (nothing of it waits for dispatch) is muted and
labelled "demand met": a share below its entitlement is then all it asked for. One with
requests waiting is labelled "backlogged", or, when its share falls more than 10 %
short of its entitlement, "▼ below entitlement" in red with its bar outlined in red:
the case a fair scheduler must correct. Red means only that (and, in the header, a
model or the server down); the apps' colours never use it. The page
keeps working when the server goes away (the status turns red, the last data stays)
and picks up again when it returns. With keys on, the page and its data need the
observer key (or an app's key, for that app's own view): the browser asks for it as a
password, or open ``/dashboard#key=<key>`` (the fragment never leaves the browser).

Examples:
    >>> from fairagents.server.dashboard import page
    >>> html = page()
    >>> html.startswith("<!doctype html>"), "/v1/fairness" in html, "://" in html   # no CDN, no other host
    (True, True, False)
    >>> "demand_met" in html and "demand met" in html
    True
"""

from __future__ import annotations

import html

__all__ = ["page"]

_PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
  :root { --bg:#101418; --card:#171d23; --line:#2a323b; --text:#e6e9ec; --dim:#8b96a1; --ok:#59a14f; --bad:#e15759; }
  @media (prefers-color-scheme: light) {
    :root { --bg:#f4f6f8; --card:#ffffff; --line:#dde2e7; --text:#1d2329; --dim:#66717c; }
  }
  * { box-sizing: border-box; }
  body { margin:0; background:var(--bg); color:var(--text); font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; }
  header { display:flex; gap:18px; align-items:baseline; padding:14px 22px; border-bottom:1px solid var(--line); flex-wrap:wrap; }
  header h1 { font-size:18px; margin:0; font-weight:600; }
  .meta { color:var(--dim); }
  .status { margin-left:auto; display:flex; gap:8px; align-items:center; }
  .dot { width:10px; height:10px; border-radius:50%; background:var(--dim); display:inline-block; }
  .dot.ok { background:var(--ok); } .dot.bad { background:var(--bad); }
  main { padding:16px 22px; display:grid; gap:16px; grid-template-columns: minmax(360px, 1fr) minmax(480px, 2fr); }
  .card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:14px 16px; min-width:0; }
  .card.full { grid-column: 1 / -1; }
  h2 { font-size:14px; margin:0 0 2px; font-weight:600; }
  .sub { color:var(--dim); font-size:12px; margin:0 0 10px; }
  svg { width:100%; display:block; overflow:visible; }
  svg text { fill:var(--text); font-size:12px; }
  svg .dim { fill:var(--dim); }
  .chips { display:flex; gap:10px; flex-wrap:wrap; }
  .chip { border:1px solid var(--line); border-radius:14px; padding:3px 10px; display:flex; gap:6px; align-items:center; }
  .agents { display:grid; grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); gap:12px 24px; }
  .legend { display:flex; gap:14px; flex-wrap:wrap; margin-top:6px; color:var(--dim); font-size:12px; }
  .swatch { width:10px; height:10px; display:inline-block; border-radius:2px; margin-right:4px; vertical-align:-1px; }
  table { width:100%; border-collapse:collapse; font-variant-numeric: tabular-nums; }
  th, td { padding:5px 8px; text-align:right; border-bottom:1px solid var(--line); white-space:nowrap; }
  th:first-child, td:first-child { text-align:left; }
  th { color:var(--dim); font-weight:500; font-size:12px; }
  tr.app td { font-weight:600; }
  tr.agent td:first-child { padding-left:26px; color:var(--dim); }
  .empty { color:var(--dim); padding:20px 0; }
  svg .demand { font-size:11px; }
  svg .backlogged { fill:var(--text); font-weight:600; }
  svg .met, svg .idle { fill:var(--dim); font-style:italic; }
  svg .under { fill:var(--bad); font-weight:600; }
  svg rect.short { stroke:var(--bad); stroke-width:2; }
  td.met, td.idle { color:var(--dim); font-style:italic; } td.backlogged { font-weight:600; } td.under { color:var(--bad); font-weight:600; }
</style>
</head>
<body>
<header>
  <h1>__TITLE__ · live fairness</h1>
  <span class="meta" id="policy">policy —</span>
  <span class="meta" id="uptime"></span>
  <div class="chips" id="models"></div>
  <span class="status"><span class="dot" id="dot"></span><span class="meta" id="updated">connecting…</span></span>
</header>
<main>
  <section class="card">
    <h2>Share of service</h2>
    <p class="sub">bar: last 30 s · ◆ since start · dashed: entitled by weight among the active apps · muted: idle, or
      demand met (nothing waiting) · red ▼ and outline: backlogged more than <span id="tolerance">10 %</span> below its
      entitlement</p>
    <svg id="shares" height="40"></svg>
  </section>
  <section class="card">
    <h2>Shares over time</h2>
    <p class="sub">each app's share of the service delivered (unified tokens, 5 s windows) · dashed: entitlements now</p>
    <svg id="timeline" height="220"></svg>
    <div class="legend" id="legend"></div>
  </section>
  <section class="card full">
    <h2>Agents within each app</h2>
    <p class="sub">share of the app's service in the last 30 s vs share of its active agents' weights · muted: idle or demand met</p>
    <div class="agents" id="agents"></div>
  </section>
  <section class="card full">
    <h2>Queues and latency</h2>
    <p class="sub">latencies from arrival at the arbiter, over recent requests · backlogged: share of the last 5 min with requests waiting</p>
    <table id="table"></table>
  </section>
  <section class="card full">
    <h2>Devices</h2>
    <p class="sub">each device splits its own service: every app's share of it in the last 30 s vs its entitlement among
      the apps active there, and since start</p>
    <table id="devices"></table>
  </section>
  <section class="card full">
    <h2>Runs</h2>
    <p class="sub">runs of agent workflows (requests that name a run), first arrival to last end · over recent completed runs</p>
    <table id="runs"></table>
  </section>
</main>
<script>
"use strict";
const REFRESH_MS = 2000, HISTORY_S = 300, SMOOTH_S = 5;
// The apps' colours: no red or pink (red marks a shortfall, and a model or the server down) and no green (healthy).
const PALETTE = ["#4e79a7", "#f28e2b", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#a0cbe8", "#ffbe7d", "#d4a6c8", "#bab0ac"];
const KEY = new URLSearchParams(location.hash.slice(1)).get("key");
const colors = new Map();
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const pct = (x) => x == null || isNaN(x) ? "–" : (100 * x).toFixed(1) + "%";
const secs = (x) => x == null ? "–" : x < 1 ? (1000 * x).toFixed(0) + " ms" : x.toFixed(2) + " s";
const num = (x) => x >= 1e6 ? (x / 1e6).toFixed(2) + "M" : x >= 1e3 ? (x / 1e3).toFixed(1) + "k" : x.toFixed(x < 10 ? 2 : 0);
const dur = (s) => s < 120 ? s.toFixed(0) + " s" : s < 7200 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h";

// Idle (left out of the entitlements), demand met (nothing waiting: the share is all it asked for), backlogged, or
// backlogged below its entitlement ("under", decided by the server with its tolerance). A fair share is owed only to a
// backlogged client.
function demand(s) {
  if (!s.active) return {cls: "idle", text: "idle", opacity: 0.35, tip: "nothing queued, running or served in the last 30 s"};
  if (s.demand_met) return {cls: "met", text: "demand met", opacity: 0.35, tip: "nothing waiting: it got all it asked for"};
  if (s.below_entitlement) return {cls: "under", text: "▼ below entitlement", opacity: 1,
    tip: `requests waiting, and its share of the last 30 s more than ${$("tolerance").textContent} short of its entitlement`};
  return {cls: "backlogged", text: "backlogged", opacity: 1, tip: "requests waiting"};
}

function color(app) {
  if (!colors.has(app)) colors.set(app, PALETTE[colors.size % PALETTE.length]);
  return colors.get(app);
}

function shareOf(delta, keys) {
  const total = keys.reduce((s, k) => s + Math.max(0, delta[k] || 0), 0);
  return total > 0 ? Object.fromEntries(keys.map((k) => [k, Math.max(0, delta[k] || 0) / total])) : null;
}

function drawShares(data) {
  const apps = Object.keys(data.apps).sort();
  apps.forEach(color);
  const W = $("shares").clientWidth || 400, label = 110, right = 150, bw = Math.max(40, W - label - right), row = 34;
  let svg = "";
  apps.forEach((name, i) => {
    const a = data.apps[name], y = i * row + 6;
    const share = a.recent_share ?? 0, x0 = label, d = demand(a), muted = d.opacity < 1;
    svg += `<text x="0" y="${y + 15}">${esc(name)}</text>`;
    svg += `<rect x="${x0}" y="${y}" width="${bw}" height="20" rx="3" fill="currentColor" opacity="0.07"></rect>`;
    svg += `<rect class="bar${d.cls === "under" ? " short" : ""}" data-app="${esc(name)}" data-share="${share.toFixed(4)}" data-demand="${d.cls}" x="${x0}" y="${y}" width="${(bw * share).toFixed(1)}" height="20" rx="3" fill="${color(name)}" opacity="${d.opacity}"></rect>`;
    const cx = x0 + bw * a.share;
    if (a.entitled_share != null) {
      const ex = x0 + bw * a.entitled_share;
      svg += `<line class="entitled" data-app="${esc(name)}" x1="${ex}" x2="${ex}" y1="${y - 3}" y2="${y + 23}" stroke="currentColor" stroke-width="2" stroke-dasharray="3 2"></line>`;
    }
    svg += `<path d="M${cx} ${y + 4} l5 6 l-5 6 l-5 -6 z" fill="currentColor" opacity="0.8"></path>`;
    const of = a.entitled_share == null ? "" : ` <tspan class="dim">of ${pct(a.entitled_share)}</tspan>`;
    svg += `<text x="${x0 + bw + 8}" y="${y + 9}" class="${muted ? "dim" : ""}" data-app="${esc(name)}" data-entitled="${a.entitled_share ?? ""}">${pct(a.recent_share)}${of}</text>`;
    svg += `<text x="${x0 + bw + 8}" y="${y + 23}" class="demand ${d.cls}" data-app="${esc(name)}">${d.text}<title>${d.tip}</title></text>`;
  });
  if (!apps.length) svg = `<text x="0" y="20" class="dim">no apps yet</text>`;
  $("shares").setAttribute("height", Math.max(40, apps.length * row + 10));
  $("shares").style.color = "var(--text)";
  $("shares").innerHTML = svg;
}

function drawTimeline(data) {
  const h = data.history, el = $("timeline");
  const W = el.clientWidth || 600, H = 220, left = 34, bottom = 20, top = 6;
  const apps = Object.keys(data.apps).sort();
  let svg = "";
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const y = top + (1 - f) * (H - top - bottom);
    svg += `<line x1="${left}" x2="${W}" y1="${y}" y2="${y}" stroke="currentColor" opacity="0.12"></line>`;
    svg += `<text x="0" y="${y + 4}" class="dim">${f * 100}%</text>`;
  }
  const t = h ? h.time : [], n = t.length;
  const points = [];
  for (let i = 1; i < n; i++) {
    let j = i - 1;
    while (j > 0 && t[i] - t[j - 1] <= SMOOTH_S) j--;
    const delta = {};
    for (const a of apps) delta[a] = h.apps[a] ? h.apps[a][i] - h.apps[a][j] : 0;
    const s = shareOf(delta, apps);
    if (s) points.push([t[i], s]);
  }
  if (points.length >= 2) {
    const t0 = Math.max(t[n - 1] - HISTORY_S, points[0][0]), t1 = t[n - 1], span = Math.max(1e-6, t1 - t0);
    const X = (x) => left + (W - left) * (x - t0) / span, Y = (f) => top + (1 - f) * (H - top - bottom);
    const base = points.map(() => 0);
    for (const a of apps) {
      const lower = base.slice(), upper = points.map(([, s], k) => (base[k] += s[a] || 0));
      const d = points.map(([x], k) => `${X(x).toFixed(1)},${Y(upper[k]).toFixed(1)}`).join(" ") + " " +
        points.map(([x], k) => `${X(x).toFixed(1)},${Y(lower[k]).toFixed(1)}`).reverse().join(" ");
      svg += `<polygon class="area" data-app="${esc(a)}" points="${d}" fill="${color(a)}" opacity="0.85"></polygon>`;
    }
    let cum = 0;
    for (const a of apps.filter((x) => data.apps[x].entitled_share != null).slice(0, -1)) {  // idle apps: no share
      cum += data.apps[a].entitled_share;
      svg += `<line x1="${left}" x2="${W}" y1="${Y(cum)}" y2="${Y(cum)}" stroke="currentColor" stroke-width="1.5" stroke-dasharray="6 4"></line>`;
    }
    svg += `<text x="${left}" y="${H - 4}" class="dim">−${dur(t1 - t0)}</text><text x="${W - 24}" y="${H - 4}" class="dim">now</text>`;
  } else {
    svg += `<text x="${left + 10}" y="${H / 2}" class="dim">waiting for traffic…</text>`;
  }
  el.style.color = "var(--text)";
  el.innerHTML = svg;
  $("legend").innerHTML = apps.map((a) => `<span><span class="swatch" style="background:${color(a)}"></span>${esc(a)} (weight ${data.apps[a].weight})</span>`).join("");
}

function drawAgents(data) {
  const apps = Object.keys(data.apps).sort();
  $("agents").innerHTML = apps.map((name) => {
    const agents = Object.entries(data.apps[name].agents).sort(([a], [b]) => a.localeCompare(b));
    const rows = agents.map(([agent, s], i) => {
      const y = i * 26 + 4, d = demand(s), share = s.recent_share ?? 0, entitled = s.entitled_share;
      return `<text x="0" y="${y + 13}">${esc(agent)}</text>` +
        `<rect x="90" y="${y}" width="${(200 * share).toFixed(1)}" height="16" rx="2" fill="${color(name)}" opacity="${d.opacity}" class="agent-bar${d.cls === "under" ? " short" : ""}" data-app="${esc(name)}" data-agent="${esc(agent)}" data-demand="${d.cls}"></rect>` +
        (entitled == null ? "" : `<line x1="${90 + 200 * entitled}" x2="${90 + 200 * entitled}" y1="${y - 2}" y2="${y + 18}" stroke="currentColor" stroke-dasharray="3 2"></line>`) +
        `<text x="298" y="${y + 13}">${pct(s.recent_share)}${entitled == null ? "" : ` <tspan class="dim">of ${pct(entitled)}</tspan>`} <tspan class="demand ${d.cls}">· ${d.text}<title>${d.tip}</title></tspan></text>`;
    }).join("");
    return `<div><h2><span class="swatch" style="background:${color(name)}"></span>${esc(name)}</h2>` +
      `<svg height="${agents.length * 26 + 8}" viewBox="0 0 520 ${agents.length * 26 + 8}" style="color:var(--text); max-width:520px">${rows}</svg></div>`;
  }).join("") || `<div class="empty">no apps yet</div>`;
}

function drawTable(data) {
  const head = ["", "weight", "share 30 s", "entitled", "demand", "backlogged", "service", "queued", "in flight", "done",
    "cancelled", "failed", "rejected", "wait p50", "wait p99", "TTFT p50", "TTFT p99"];
  const row = (cls, name, s, d = demand(s)) => `<tr class="${cls}"><td>${esc(name)}</td><td>${s.weight}</td><td>${pct(s.recent_share)}</td>` +
    `<td>${pct(s.entitled_share)}</td><td class="${d.cls}" title="${d.tip}">${d.text}</td><td>${pct(s.backlogged)}</td>` +
    `<td>${num(s.service)}</td><td>${s.queued}</td><td>${s.in_flight}</td><td>${s.done}</td>` +
    `<td>${s.cancelled}</td><td>${s.failed}</td><td>${s.rejected}</td><td>${secs(s.wait_seconds.p50)}</td>` +
    `<td>${secs(s.wait_seconds.p99)}</td><td>${secs(s.ttft_seconds.p50)}</td><td>${secs(s.ttft_seconds.p99)}</td></tr>`;
  let body = "";
  for (const name of Object.keys(data.apps).sort()) {
    const a = data.apps[name];
    body += row("app", name, a);
    for (const agent of Object.keys(a.agents).sort()) body += row("agent", agent, a.agents[agent]);
  }
  $("table").innerHTML = `<thead><tr>${head.map((x) => `<th>${x}</th>`).join("")}</tr></thead><tbody>${body}</tbody>`;
}

function drawDevices(data) {
  const head = ["", "models", "share 30 s", "entitled", "since start", "service"];
  let body = "";
  for (const [device, d] of Object.entries(data.devices || {}).sort(([a], [b]) => a.localeCompare(b))) {
    const models = Object.keys(data.models).filter((m) => data.models[m].device === device).sort();
    body += `<tr class="app"><td>${esc(device)}</td><td>${esc(models.join(", "))}</td><td></td><td></td><td></td>` +
      `<td>${num(d.service)}</td></tr>`;
    for (const [app, s] of Object.entries(d.apps).sort(([a], [b]) => a.localeCompare(b))) {
      body += `<tr class="agent device-app" data-device="${esc(device)}" data-app="${esc(app)}"><td>${esc(app)}</td>` +
        `<td></td><td>${pct(s.recent_share)}</td><td>${pct(s.entitled_share)}</td><td>${pct(s.share)}</td>` +
        `<td>${num(s.service)}</td></tr>`;
    }
  }
  $("devices").innerHTML = body ? `<thead><tr>${head.map((x) => `<th>${x}</th>`).join("")}</tr></thead><tbody>${body}</tbody>`
    : `<tbody><tr><td class="empty">no service yet</td></tr></tbody>`;
}

function drawRuns(data) {
  const head = ["", "completed", "active", "duration mean", "duration p95", "calls mean", "service mean"];
  const fixed = (x) => x == null ? "–" : x.toFixed(1);
  const rows = Object.keys(data.apps).sort().filter((name) => data.apps[name].runs &&
    (data.apps[name].runs.completed || data.apps[name].runs.active)).map((name) => {
    const r = data.apps[name].runs;
    return `<tr class="app run" data-app="${esc(name)}"><td>${esc(name)}</td><td>${r.completed}</td><td>${r.active}</td>` +
      `<td>${secs(r.duration_seconds.mean)}</td><td>${secs(r.duration_seconds.p95)}</td><td>${fixed(r.calls_mean)}</td>` +
      `<td>${r.service_mean == null ? "–" : num(r.service_mean)}</td></tr>`;
  }).join("");
  $("runs").innerHTML = rows ? `<thead><tr>${head.map((x) => `<th>${x}</th>`).join("")}</tr></thead><tbody>${rows}</tbody>`
    : `<tbody><tr><td class="empty">no runs yet</td></tr></tbody>`;
}

function drawHeader(data) {
  $("policy").textContent = `policy ${data.policy}` + (data.draining ? " · draining" : "");
  $("uptime").textContent = `up ${dur(data.uptime_seconds)}`;
  const pool = data.pool && data.pool.in_flight_limit !== null
    ? `<span class="chip">pool · ${data.pool.in_flight}/${data.pool.in_flight_limit} in flight</span>` : "";
  $("models").innerHTML = pool + Object.entries(data.models).map(([name, m]) =>
    `<span class="chip"><span class="dot ${m.healthy ? "ok" : "bad"}"></span>${esc(name)} · ${m.in_flight}/${m.in_flight_limit} in flight · ${m.queued} queued</span>`).join("");
}

function status(ok, text) {
  $("dot").className = "dot " + (ok ? "ok" : "bad");
  $("updated").textContent = text;
}

async function tick() {
  try {
    const response = await fetch(`/v1/fairness?history=${HISTORY_S}`, {cache: "no-store", headers: KEY ? {Authorization: `Bearer ${KEY}`} : {}});
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    $("tolerance").textContent = (100 * data.entitlement.tolerance).toFixed(0) + " %";
    drawHeader(data); drawShares(data); drawTimeline(data); drawAgents(data); drawTable(data); drawDevices(data); drawRuns(data);
    status(true, "updated " + new Date().toLocaleTimeString());
    document.body.dataset.ready = "1";
  } catch (err) {
    status(false, `offline (${err.message}) · retrying`);
  } finally {
    setTimeout(tick, REFRESH_MS);
  }
}
tick();
</script>
</body>
</html>
"""


def page(title: str = "fairagents") -> str:
    """The dashboard's HTML, with ``title`` in its heading.

    Examples:
        >>> from fairagents.server.dashboard import page
        >>> "<title>studio &amp; co</title>" in page("studio & co")
        True
    """
    return _PAGE.replace("__TITLE__", html.escape(title))
