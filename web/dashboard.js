// voicert live latency dashboard: plain canvas drawing, no libraries, no network beyond this server.
// Every chart shares one session filter (a row of the sessions table, or the header's select) and
// one budget (the server's telemetry.budget_ms, or the one set on the page, kept in this browser).
"use strict";

// one colour per stage, shared with the browser client and the load generator's plots (/stages.js)
const STAGE_COLOURS = (window.VOICERT_STAGES || { colours: {} }).colours;
const colour = k => STAGE_COLOURS[k] || "#999";
const PCT_STAGES = ["endpoint_ms", "ingest_ms", "asr_ms", "queue_ms", "prefill_ms", "first_token_ms", "send_ms",
                    "ttft_ms", "voice_to_first_token_ms", "ttfa_ms"];
const INK = "#c9d1d9", MUTED = "#8b96a5", GRID = "#242c36", RED = "#f85149";
const STOPPED = new Set(["interrupted", "cancelled", "error"]);
const BUDGET_KEY = "voicert.dashboard.budget";
const state = { turns: [], waterfall: [], serverBudget: 100, budget: 100, series: [], maxTurns: 200,
                session: "" };

function percentile(xs, q) {
  if (!xs.length) return 0;
  const s = xs.slice().sort((a, b) => a - b);
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil(q / 100 * s.length) - 1));
  return s[i];
}

function shown() {  // the turns the charts draw: one session's, or everyone's
  return state.session ? state.turns.filter(t => t.session_id === state.session) : state.turns;
}

function over(t) { return t.ttft_ms !== undefined && t.ttft_ms !== null && t.ttft_ms > state.budget; }

function setup(canvas) {
  // the canvas fills its panel's width, drawn at the screen's pixel density
  const dpr = window.devicePixelRatio || 1, w = canvas.clientWidth || 600;
  const h = Number(canvas.getAttribute("height")) / (canvas.dataset.dpr || 1);
  canvas.dataset.dpr = dpr;
  canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  canvas.style.height = `${h}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, w, h };
}

function niceStep(span, n) {  // a round step giving about n ticks over span
  const raw = span / Math.max(1, n), mag = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
}

function clock(t) { return new Date(t * 1000).toLocaleTimeString([], { hour12: false }); }

function timeAxis(ctx, x0, x1, y, t0, t1) {
  // wall-clock ticks along the bottom of a chart (the turns' and samples' own times)
  ctx.fillStyle = MUTED; ctx.strokeStyle = GRID;
  const step = niceStep(t1 - t0, 6);
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    const x = x0 + (x1 - x0) * (t - t0) / (t1 - t0 || 1);
    ctx.beginPath(); ctx.moveTo(x, 4); ctx.lineTo(x, y); ctx.stroke();
    ctx.fillText(clock(t), Math.min(x - 22, x1 - 48), y + 13);
  }
}

function valueAxis(ctx, x0, x1, y0, y1, maxV, unit) {
  ctx.fillStyle = MUTED; ctx.strokeStyle = GRID;
  const step = niceStep(maxV, 4);
  for (let v = 0; v <= maxV; v += step) {
    const y = y0 - (y0 - y1) * v / maxV;
    ctx.beginPath(); ctx.moveTo(x0, y); ctx.lineTo(x1, y); ctx.stroke();
    ctx.fillText(`${+v.toFixed(2)}${unit}`, 2, y + 4);
  }
}

function drawWaterfall() {
  const { ctx, w, h } = setup(document.getElementById("waterfall"));
  const rows = shown().slice(-26);
  if (!rows.length) { ctx.fillStyle = MUTED; ctx.fillText("no turns yet", 20, 20); return; }
  const left = 230, right = w - 10, top = 6, rowH = Math.min(20, (h - 26) / rows.length);
  const total = r => state.waterfall.reduce((s, k) => s + (r.stages[k] || 0), 0);
  const maxMs = Math.max(...rows.map(r => Math.max(total(r), (r.stages.endpoint_ms || 0) + state.budget)));
  const x = ms => left + (right - left) * ms / maxMs;
  ctx.strokeStyle = GRID; ctx.fillStyle = MUTED;
  const step = niceStep(maxMs, 6);
  for (let v = 0; v <= maxMs; v += step) {
    ctx.beginPath(); ctx.moveTo(x(v), top); ctx.lineTo(x(v), h - 18); ctx.stroke();
    ctx.fillText(`${v} ms`, Math.min(x(v) + 2, right - 46), h - 4);
  }
  rows.forEach((r, i) => {
    const y = top + i * rowH;
    let acc = 0;
    state.waterfall.forEach(k => {
      const v = r.stages[k] || 0;
      ctx.fillStyle = colour(k);
      ctx.fillRect(x(acc), y, Math.max(x(acc + v) - x(acc), 0.5), rowH - 3);
      acc += v;
    });
    const b = x((r.stages.endpoint_ms || 0) + state.budget);
    ctx.fillStyle = RED; ctx.fillRect(b - 1, y - 1, 2, rowH - 1);
    if (STOPPED.has(r.finish_reason)) {  // the caller talked over it, or it was cancelled
      ctx.fillStyle = RED;
      ctx.fillText(`\u2715 ${r.finish_reason}`, Math.min(x(acc) + 4, right - 80), y + rowH - 4);
    }
    ctx.fillStyle = over(r) ? RED : INK;
    ctx.fillText(label(r), 4, y + rowH - 4);
  });
}

function label(r) {  // what the caller said, else the session and turn
  const said = (r.said || "").trim();
  const text = said ? `"${said}"` : `${r.session_id.slice(0, 6)}/${r.turn_id}`;
  return text.length > 34 ? text.slice(0, 33) + "\u2026" : text;
}

function drawPercentiles() {
  const { ctx, w, h } = setup(document.getElementById("percentiles"));
  const turns = shown();
  const stats = PCT_STAGES.map(k => {
    const xs = turns.map(t => t.stages[k]).filter(v => v !== undefined);
    return { k, n: xs.length, p50: percentile(xs, 50), p95: percentile(xs, 95), p99: percentile(xs, 99) };
  });
  const maxMs = Math.max(state.budget * 1.2, ...stats.map(s => s.p99));
  const left = 150, right = w - 10, rowH = (h - 20) / stats.length;
  const x = ms => left + (right - left) * ms / maxMs;
  ctx.fillStyle = RED;  // under the figures, so they stay readable
  ctx.fillRect(x(state.budget) - 1, 0, 2, h - 15);
  stats.forEach((s, i) => {
    const y = 5 + i * rowH;
    ctx.fillStyle = INK;
    ctx.fillText(s.k.replace(/_ms$/, ""), 4, y + rowH / 2 + 4);
    [["p99", "#a04848"], ["p95", "#b38b2e"], ["p50", "#3f8f5a"]].forEach(([q, c]) => {
      ctx.fillStyle = c;
      ctx.fillRect(left, y + 3, x(s[q]) - left, rowH - 8);
    });
    ctx.fillStyle = "#fff";
    ctx.fillText(s.n ? `${s.p50.toFixed(0)} / ${s.p95.toFixed(0)} / ${s.p99.toFixed(0)} ms` : "-",
                 left + 4, y + rowH / 2 + 4);
  });
  ctx.fillStyle = RED;
  ctx.fillText(`budget ${state.budget} ms`, Math.min(x(state.budget) + 4, right - 90), h - 3);
}

function drawTimeline() {
  // every turn at its time: voice -> first token (dot, the dominant stage's colour) and TTFT
  // (ring, red when over the budget)
  const { ctx, w, h } = setup(document.getElementById("timeline"));
  const turns = shown().filter(t => t.wall_time);
  if (!turns.length) { ctx.fillStyle = MUTED; ctx.fillText("no turns yet", 20, 20); return; }
  const t1 = Math.max(...turns.map(t => t.wall_time)), t0 = Math.min(t1 - 60, ...turns.map(t => t.wall_time));
  const v2ft = t => t.stages.voice_to_first_token_ms;
  const maxV = Math.max(state.budget * 1.2, ...turns.map(t => Math.max(v2ft(t) || 0, t.ttft_ms || 0))) * 1.05;
  const x0 = 52, x1 = w - 10, y0 = h - 20, y1 = 6;
  const x = t => x0 + (x1 - x0) * (t - t0) / (t1 - t0 || 1), y = v => y0 - (y0 - y1) * v / maxV;
  valueAxis(ctx, x0, x1, y0, y1, maxV, " ms");
  timeAxis(ctx, x0, x1, y0, t0, t1);
  ctx.strokeStyle = RED; ctx.setLineDash([5, 4]);
  ctx.beginPath(); ctx.moveTo(x0, y(state.budget)); ctx.lineTo(x1, y(state.budget)); ctx.stroke();
  ctx.setLineDash([]);
  for (const t of turns) {
    if (v2ft(t) !== undefined) {
      ctx.fillStyle = colour(t.dominant_stage || "");
      ctx.beginPath(); ctx.arc(x(t.wall_time), y(v2ft(t)), 4, 0, 2 * Math.PI); ctx.fill();
    }
    if (t.ttft_ms !== undefined && t.ttft_ms !== null) {
      ctx.strokeStyle = over(t) ? RED : "#8b96a5";
      ctx.beginPath(); ctx.arc(x(t.wall_time), y(t.ttft_ms), 3, 0, 2 * Math.PI); ctx.stroke();
    }
  }
}

function drawLine(id, key, name, colourOf, unit) {
  // one system figure over the samples' wall-clock times, on its own axis
  const { ctx, w, h } = setup(document.getElementById(id));
  const pts = state.series.slice(-300);
  ctx.fillStyle = colourOf; ctx.fillText(name, 56, 12);
  if (pts.length < 2) { ctx.fillStyle = MUTED; ctx.fillText("waiting for samples", 56, 30); return; }
  const maxV = Math.max(unit === "" ? 1 : 0.5, ...pts.map(p => p[key])) * 1.1;
  const t0 = pts[0].t, t1 = pts[pts.length - 1].t;
  const x0 = 52, x1 = w - 8, y0 = h - 20, y1 = 16;
  const x = t => x0 + (x1 - x0) * (t - t0) / (t1 - t0 || 1), y = v => y0 - (y0 - y1) * v / maxV;
  valueAxis(ctx, x0, x1, y0, y1, maxV, unit);
  timeAxis(ctx, x0, x1, y0, t0, t1);
  ctx.strokeStyle = colourOf; ctx.lineWidth = 2; ctx.beginPath();
  pts.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p[key])) : ctx.moveTo(x(p.t), y(p[key]))));
  ctx.stroke(); ctx.lineWidth = 1;
}

function drawSeries() {
  drawLine("series", "sessions", "sessions", "#58a6ff", "");
  drawLine("series-batch", "batch", "engine batch (rows a step)", "#f0883e", "");
  drawLine("series-lag", "lag", "event-loop lag", "#d2a8ff", " ms");
}

function sessionRows() {
  const by = new Map();
  for (const t of state.turns) {
    if (!by.has(t.session_id)) by.set(t.session_id, []);
    by.get(t.session_id).push(t);
  }
  return [...by.entries()].map(([id, turns]) => {
    const v = turns.map(t => t.stages.voice_to_first_token_ms).filter(x => x !== undefined);
    const ttft = turns.map(t => t.ttft_ms).filter(x => x !== undefined && x !== null);
    const last = turns[turns.length - 1];
    return { id, n: turns.length, p50: percentile(v, 50), p95: percentile(v, 95),
             ttft99: percentile(ttft, 99), over: turns.filter(over).length, said: last.said || "",
             at: last.wall_time || 0 };
  }).sort((a, b) => b.at - a.at);
}

// Every string from the feed (session ids carry a phone call's ids, "said" the caller's words,
// stage names the server's) reaches the page as text, never as markup.
function node(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (className) e.className = className;
  return e;
}

function swatch(k) {
  const i = node("i");
  i.style.background = colour(k);
  return i;
}

function showSessions() {
  const rows = sessionRows(), table = document.getElementById("session-table");
  const fmt = v => (v ? v.toFixed(0) : "-");
  table.innerHTML = "<tr><th>session</th><th>turns</th><th title='voice to first token'>V2FT P50 / P95</th>" +
    "<th>TTFT P99</th><th>over</th><th>last said</th></tr>";
  const all = document.createElement("tr");
  all.dataset.session = "";
  const rest = node("td");
  rest.colSpan = 4;
  all.append(node("td", "all"), node("td", String(state.turns.length)), rest);
  table.appendChild(all);
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset.session = r.id;
    const id = node("td", r.id.slice(0, 8));
    id.title = r.id;
    tr.append(id, node("td", String(r.n)), node("td", `${fmt(r.p50)} / ${fmt(r.p95)}`),
      node("td", fmt(r.ttft99), r.ttft99 > state.budget ? "over" : ""), node("td", String(r.over)),
      node("td", r.said.length > 40 ? `${r.said.slice(0, 39)}\u2026` : r.said, "said"));
    tr.title = r.said;
    table.appendChild(tr);
  }
  for (const tr of table.querySelectorAll("tr[data-session]")) {
    tr.classList.toggle("picked", tr.dataset.session === state.session);
    tr.onclick = () => pick(tr.dataset.session);
  }
  const sel = document.getElementById("session-filter");
  const want = [""].concat(rows.map(r => r.id));
  if ([...sel.options].map(o => o.value).join() !== want.join()) {
    sel.replaceChildren(...want.map(id => new Option(id ? id.slice(0, 12) : "all", id)));
  }
  sel.value = state.session;
}

function pick(session) {  // drill down into one session (or back to all)
  state.session = session;
  render();
}

function showLast() {
  const turns = shown(), t = turns[turns.length - 1], el = document.getElementById("last");
  if (!t) { el.replaceChildren(); return; }
  document.getElementById("last-label").textContent = `${t.session_id.slice(0, 12)} / turn ${t.turn_id}` +
    (t.said ? ` \u00b7 "${t.said}"` : "");
  const head = node("tr");
  head.append(node("th", "stage"), node("th", "ms"));
  const rows = Object.entries(t.stages).map(([k, v]) => {
    const tr = node("tr"), name = node("td");
    const mark = swatch(k);
    mark.className = "swatch";
    name.append(mark, k);
    tr.append(name, node("td", Number(v).toFixed(1)));
    return tr;
  });
  const dominant = node("tr");
  dominant.append(node("td", "dominant"), node("td", t.dominant_stage || "-"));
  el.replaceChildren(head, ...rows, dominant);
}

function render() {
  const n = state.turns.length, c = document.getElementById("turn-count");
  c.textContent = String(n); c.dataset.turns = String(n);
  document.getElementById("budget").textContent = String(state.budget);
  const overN = shown().filter(over).length;
  document.getElementById("over").textContent = String(overN);
  document.getElementById("over-chip").classList.toggle("bad", overN > 0);
  drawWaterfall(); drawPercentiles(); drawTimeline(); drawSeries(); showSessions(); showLast();
}

function legend() {
  document.getElementById("legend").replaceChildren(...state.waterfall.map(k => {
    const span = node("span");
    span.append(swatch(k), k.replace(/_ms$/, ""));
    return span;
  }));
}

function setBudget(ms, keep) {
  state.budget = ms;
  document.getElementById("budget-input").value = String(ms);
  if (keep) localStorage.setItem(BUDGET_KEY, String(ms));
}

function connect() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const token = new URLSearchParams(location.search).get("token");  // when the server wants one
  const query = token ? `?token=${encodeURIComponent(token)}` : "";
  const ws = new WebSocket(`${proto}//${location.host}/v1/dashboard${query}`);
  const status = document.getElementById("status");
  ws.onopen = () => { status.textContent = "live"; status.className = "pill ok"; };
  ws.onclose = () => {
    status.textContent = "disconnected, retrying"; status.className = "pill down";
    setTimeout(connect, 1000);
  };
  ws.onmessage = ev => {
    const msg = JSON.parse(ev.data);
    if (msg.type === "snapshot") {
      state.serverBudget = msg.budget_ms; state.waterfall = msg.waterfall; state.maxTurns = msg.max_turns;
      const mine = Number(localStorage.getItem(BUDGET_KEY));
      setBudget(mine > 0 ? mine : msg.budget_ms, false);
      state.turns = msg.turns; legend();
    } else if (msg.type === "turn") {
      state.turns.push(msg.turn);
      if (state.turns.length > state.maxTurns) state.turns.shift();
    } else if (msg.type === "system") {
      state.series.push({ t: msg.t, sessions: msg.sessions, batch: msg.mean_batch, lag: msg.loop_lag_ms });
      if (state.series.length > 600) state.series.shift();
      document.getElementById("sessions").textContent = String(msg.sessions);
    }
    render();
  };
}

document.getElementById("budget-input").onchange = e => {
  const ms = Number(e.target.value);
  if (ms > 0) setBudget(ms, true); else { localStorage.removeItem(BUDGET_KEY); setBudget(state.serverBudget, false); }
  render();
};
document.getElementById("session-filter").onchange = e => pick(e.target.value);
window.addEventListener("resize", render);
render();
connect();
