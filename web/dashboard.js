// voicert live latency dashboard: plain canvas drawing, no libraries, no network beyond this server.
"use strict";

// one colour per stage, shared with the browser client and the load generator's plots (/stages.js)
const STAGE_COLOURS = (window.VOICERT_STAGES || { colours: {} }).colours;
const colour = k => STAGE_COLOURS[k] || "#999";
const PCT_STAGES = ["endpoint_ms", "asr_ms", "queue_ms", "prefill_ms", "first_token_ms", "send_ms",
                    "ttft_ms", "voice_to_first_token_ms", "ttfa_ms"];
const state = { turns: [], waterfall: [], budget: 100, series: [], maxTurns: 200 };

function percentile(xs, q) {
  if (!xs.length) return 0;
  const s = xs.slice().sort((a, b) => a - b);
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil(q / 100 * s.length) - 1));
  return s[i];
}

function setup(canvas) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "11px system-ui, sans-serif";
  return ctx;
}

function drawWaterfall() {
  const cv = document.getElementById("waterfall"), ctx = setup(cv);
  const rows = state.turns.slice(-24);
  if (!rows.length) { ctx.fillText("no turns yet", 20, 20); return; }
  const left = 210, right = cv.width - 10, top = 10, rowH = Math.min(14, (cv.height - 30) / rows.length);
  const total = r => state.waterfall.reduce((s, k) => s + (r.stages[k] || 0), 0);
  const maxMs = Math.max(...rows.map(r => Math.max(total(r), (r.stages.endpoint_ms || 0) + state.budget)));
  const x = ms => left + (right - left) * ms / maxMs;
  rows.forEach((r, i) => {
    const y = top + i * rowH;
    let acc = 0;
    state.waterfall.forEach((k, j) => {
      const v = r.stages[k] || 0;
      ctx.fillStyle = colour(k);
      ctx.fillRect(x(acc), y, Math.max(x(acc + v) - x(acc), 0.5), rowH - 2);
      acc += v;
    });
    const b = x((r.stages.endpoint_ms || 0) + state.budget);
    ctx.fillStyle = "#d00"; ctx.fillRect(b - 1, y - 1, 2, rowH);
    if (STOPPED.has(r.finish_reason)) {  // the caller talked over it, or it was cancelled
      ctx.fillStyle = "#b00";
      ctx.fillText(`\u2715 ${r.finish_reason}`, Math.min(x(acc) + 4, right - 80), y + rowH - 3);
    }
    ctx.fillStyle = r.over_budget ? "#b00" : "#222";
    ctx.fillText(label(r), 4, y + rowH - 3);
  });
  ctx.fillStyle = "#555";
  ctx.fillText(`0 ms`, left, cv.height - 4);
  ctx.fillText(`${maxMs.toFixed(0)} ms`, right - 50, cv.height - 4);
}

const STOPPED = new Set(["interrupted", "cancelled", "error"]);

function label(r) {  // what the caller said, else the session and turn
  const said = (r.said || "").trim();
  const text = said ? `"${said}"` : `${r.session_id.slice(0, 6)}/${r.turn_id}`;
  return text.length > 30 ? text.slice(0, 29) + "\u2026" : text;
}

function drawPercentiles() {
  const cv = document.getElementById("percentiles"), ctx = setup(cv);
  const stats = PCT_STAGES.map(k => {
    const xs = state.turns.map(t => t.stages[k]).filter(v => v !== undefined);
    return { k, n: xs.length, p50: percentile(xs, 50), p95: percentile(xs, 95), p99: percentile(xs, 99) };
  });
  const maxMs = Math.max(state.budget * 1.2, ...stats.map(s => s.p99));
  const left = 150, right = cv.width - 10, rowH = (cv.height - 20) / stats.length;
  const x = ms => left + (right - left) * ms / maxMs;
  stats.forEach((s, i) => {
    const y = 5 + i * rowH;
    ctx.fillStyle = "#222";
    ctx.fillText(s.k.replace(/_ms$/, ""), 4, y + rowH / 2 + 4);
    [["p99", "#f4b6b6"], ["p95", "#f0d58a"], ["p50", "#7fbf7f"]].forEach(([q, c]) => {
      ctx.fillStyle = c;
      ctx.fillRect(left, y + 3, x(s[q]) - left, rowH - 8);
    });
    ctx.fillStyle = "#333";
    ctx.fillText(`${s.p50.toFixed(0)} / ${s.p95.toFixed(0)} / ${s.p99.toFixed(0)}`, left + 4, y + rowH / 2 + 4);
  });
  ctx.fillStyle = "#d00";
  ctx.fillRect(x(state.budget) - 1, 0, 2, cv.height - 15);
  ctx.fillText(`budget ${state.budget} ms`, Math.min(x(state.budget) + 4, right - 90), cv.height - 3);
}

function drawSeries() {
  const cv = document.getElementById("series"), ctx = setup(cv);
  const pts = state.series.slice(-180);
  if (pts.length < 2) { ctx.fillText("waiting for samples", 20, 20); return; }
  const maxY = Math.max(1, ...pts.map(p => Math.max(p.sessions, p.batch)));
  const x = i => 40 + (cv.width - 50) * i / (pts.length - 1);
  const y = v => cv.height - 20 - (cv.height - 30) * v / maxY;
  [["sessions", "#1f77b4"], ["batch", "#ff7f0e"]].forEach(([k, c]) => {
    ctx.strokeStyle = c; ctx.lineWidth = 2; ctx.beginPath();
    pts.forEach((p, i) => (i ? ctx.lineTo(x(i), y(p[k])) : ctx.moveTo(x(i), y(p[k]))));
    ctx.stroke();
    ctx.fillStyle = c; ctx.fillText(k, k === "sessions" ? 45 : 120, 12);
  });
  ctx.fillStyle = "#555"; ctx.fillText(String(maxY), 4, 14); ctx.fillText("0", 4, cv.height - 20);
}

function showLast() {
  const t = state.turns[state.turns.length - 1], el = document.getElementById("last");
  if (!t) return;
  el.innerHTML = "<tr><th>stage</th><th>ms</th></tr>" + Object.entries(t.stages)
    .map(([k, v]) => `<tr><td>${k}</td><td>${v.toFixed(1)}</td></tr>`).join("") +
    `<tr><td>dominant</td><td>${t.dominant_stage || "-"}</td></tr>`;
}

function render() {
  const n = state.turns.length, c = document.getElementById("turn-count");
  c.textContent = String(n); c.dataset.turns = String(n);
  document.getElementById("budget").textContent = String(state.budget);
  document.getElementById("over").textContent = String(state.turns.filter(t => t.over_budget).length);
  drawWaterfall(); drawPercentiles(); drawSeries(); showLast();
}

function legend() {
  document.getElementById("legend").innerHTML = state.waterfall
    .map(k => `<span><i style="background:${colour(k)}"></i>${k.replace(/_ms$/, "")}</span>`)
    .join("");
}

function connect() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const token = new URLSearchParams(location.search).get("token");  // when the server wants one
  const query = token ? `?token=${encodeURIComponent(token)}` : "";
  const ws = new WebSocket(`${proto}//${location.host}/v1/dashboard${query}`);
  const status = document.getElementById("status");
  ws.onopen = () => { status.textContent = "live"; status.className = "ok"; };
  ws.onclose = () => {
    status.textContent = "disconnected, retrying"; status.className = "down";
    setTimeout(connect, 1000);
  };
  ws.onmessage = ev => {
    const msg = JSON.parse(ev.data);
    if (msg.type === "snapshot") {
      state.budget = msg.budget_ms; state.waterfall = msg.waterfall; state.maxTurns = msg.max_turns;
      state.turns = msg.turns; legend();
    } else if (msg.type === "turn") {
      state.turns.push(msg.turn);
      if (state.turns.length > state.maxTurns) state.turns.shift();
    } else if (msg.type === "system") {
      state.series.push({ sessions: msg.sessions, batch: msg.mean_batch });
      if (state.series.length > 600) state.series.shift();
      document.getElementById("sessions").textContent = String(msg.sessions);
    }
    render();
  };
}

render();
connect();
