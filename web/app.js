// voicert browser client: microphone -> AudioWorklet (16 kHz PCM16, 20 ms frames) -> /v1/stream
// (JSON text frames of the native protocol, docs/protocol.md); live partial transcripts, the reply
// as it streams, its speech played as it arrives, each turn's latency waterfall, the agent's state
// (from the server's events), both sides' audio drawn live, tool calls as panels and every event.
// No build step, no CDN. window.voicert exposes the state for tests and debugging.
"use strict";

// the stage table, its order and colours shared with the dashboard and the load generator (/stages.js)
const STAGES = window.VOICERT_STAGES || { waterfall: [], colours: {}, docs: {} };
const WATERFALL = STAGES.waterfall;
const OUT_RATE = 24000;  // the reply's speech: pcm16 at 24 kHz
const MAX_EVENTS = 400;  // rows kept in the event inspector
const SCOPE_POINTS = 160;  // level history drawn per side (one point each 50 ms: 8 s)
const $ = (id) => document.getElementById(id);

const app = {
  ws: null, running: false, started: false, mode: "hands-free", held: false, muted: false,
  stream: null, captureCtx: null, playCtx: null, node: null, source: null,
  playhead: 0, sources: new Set(), agentEls: new Map(), reconnectDelay: 500, reconnectTimer: null,
  sessionId: "", t0: performance.now(), transcript: [], latencyRows: [], scaleMs: 500,
  thinkingSince: 0, thinkingTimer: null, agentLevel: 0, youLevel: 0,
  agentState: "idle", stateLog: [], tools: new Map(),
  levels: { you: new Array(SCOPE_POINTS).fill(0), agent: new Array(SCOPE_POINTS).fill(0) },
  stats: { framesSent: 0, audioChunks: 0, reconnects: 0, turns: 0, events: 0 },
};
window.voicert = app;

// ------------------------------------------------------------------ settings (kept in localStorage)

const SETTINGS = ["server-url", "token", "system-prompt", "max-tokens", "end-of-turn", "silence-ms",
                  "vad-threshold", "mic", "voice"];

function loadSettings() {
  for (const id of SETTINGS) {
    const v = localStorage.getItem(`voicert.${id}`);
    if (v !== null && id !== "mic" && id !== "voice") $(id).value = v;  // those two: once listed
  }
  const token = new URLSearchParams(location.search).get("token");  // a link may carry one
  if (token) $("token").value = token;
}

function saveSetting(id) { localStorage.setItem(`voicert.${id}`, $(id).value); }

function listVoices(voices, current) {
  // the server's voices (session.started); the saved pick, where this server offers it, is asked
  // for at once with session.update (a start naming a voice the server lacks would be refused)
  const sel = $("voice"), want = localStorage.getItem("voicert.voice") || "";
  sel.replaceChildren(...voices.map((v, i) => new Option(i === 0 ? `${v} (the server's default)` : v, v)));
  sel.disabled = voices.length === 0;
  if (!voices.length) { sel.append(new Option("no speech output on this server", "")); return; }
  sel.value = current || voices[0];
  if (want && want !== current && voices.includes(want)) {
    sel.value = want;
    send({ type: "session.update", voice: want });
  }
}

function setStatus(text, cls) { const s = $("status"); s.textContent = text; s.className = `pill ${cls}`; }

// ------------------------------------------------------------------ the agent's state

const STATE_TEXT = { idle: "idle", connecting: "connecting", listening: "listening",
                     hearing: "hearing you", heard: "heard you", thinking: "thinking",
                     speaking: "speaking" };

function agentState(name) {
  // driven by the server's events: speech started -> hearing; the endpoint (vad.speech_stopped)
  // -> heard you, the moment the turn ends; the transcript -> thinking; tokens or audio -> speaking
  if (app.agentState === name) return;
  app.agentState = name;
  app.stateLog.push([Math.round(performance.now() - app.t0), name]);
  const el = $("agent-state");
  el.dataset.state = name;
  el.textContent = STATE_TEXT[name] || name;
}

function settle() {
  // a reply is over once its last audio has played: back to listening (if still connected)
  if (app.started && !app.sources.size && !app.replying) agentState("listening");
}
function banner(text) { const b = $("banner"); b.textContent = text || ""; b.classList.toggle("show", !!text); }

function streamUrl() {
  // the settings' server (ws://, wss://, http://, https:// or host:port), else this page's server
  const typed = $("server-url").value.trim();
  const token = $("token").value.trim();
  let url;
  if (typed) {
    url = new URL(/^[a-z]+:\/\//i.test(typed) ? typed : `http://${typed}`);
    url.protocol = { "https:": "wss:", "wss:": "wss:" }[url.protocol] || "ws:";
    if (url.pathname === "/" || !url.pathname) url.pathname = "/v1/stream";
  } else {
    url = new URL(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/stream`);
  }
  if (token) url.searchParams.set("token", token);
  return url.toString();
}

function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function fromBase64(b64) {
  const s = atob(b64), out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out.buffer;
}

function send(msg) {
  if (app.ws && app.ws.readyState === WebSocket.OPEN) {
    app.ws.send(JSON.stringify(msg));
    logEvent("out", msg);
    return true;
  }
  return false;
}

// ------------------------------------------------------------------ event inspector

function logEvent(dir, msg) {
  const audio = msg.type === "audio" || msg.type === "response.audio";
  if (audio && !$("show-audio").checked) return;
  app.stats.events++;
  const shown = Object.assign({}, msg);
  for (const k of ["audio"]) if (typeof shown[k] === "string") shown[k] = `<${Math.floor(shown[k].length * 3 / 4)} bytes>`;
  const row = document.createElement("div");
  row.className = `ev ${dir === "out" ? "out" : (msg.type === "error" ? "err" : "in")}`;
  row.dataset.dir = dir;
  row.dataset.type = msg.type;
  const t = ((performance.now() - app.t0) / 1000).toFixed(3);
  const line = document.createElement("span");  // (a row is the only div: tests count them)
  line.className = "line";
  line.textContent = `${t} ${dir === "out" ? "\u2191" : "\u2193"} ${msg.type} ${JSON.stringify(shown)}`;
  const whole = document.createElement("pre");
  whole.textContent = JSON.stringify(shown, null, 2);
  row.append(line, whole);
  row.onclick = () => row.classList.toggle("open");  // the event whole, pretty-printed
  filterRow(row);
  const list = $("events");
  const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
  list.appendChild(row);
  while (list.childElementCount > MAX_EVENTS) list.firstElementChild.remove();
  if (atBottom) list.scrollTop = list.scrollHeight;
  $("event-count").textContent = String(app.stats.events);
}

function filterRow(row) {
  const q = $("event-filter").value.trim().toLowerCase();
  const dirOk = $(row.dataset.dir === "out" ? "show-out" : "show-in").checked;
  row.classList.toggle("hidden", !dirOk || (q !== "" && !row.textContent.toLowerCase().includes(q)));
}

function filterEvents() { for (const row of $("events").children) filterRow(row); }

// ------------------------------------------------------------------ audio in

function micConstraints() {
  const id = $("mic").value;
  return { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true,
           ...(id ? { deviceId: { exact: id } } : {}) };
}

async function openMic() {
  app.stream = await navigator.mediaDevices.getUserMedia({ audio: micConstraints() });
  app.source = app.captureCtx.createMediaStreamSource(app.stream);
  app.source.connect(app.node);
}

async function startAudio() {
  app.captureCtx = new AudioContext({ sampleRate: 16000 });  // the browser resamples the mic for us
  await app.captureCtx.audioWorklet.addModule("/capture-worklet.js");
  app.node = new AudioWorkletNode(app.captureCtx, "voicert-capture");
  const mute = app.captureCtx.createGain();
  mute.gain.value = 0;  // keep the node pulled by the graph without echoing the mic
  app.node.connect(mute).connect(app.captureCtx.destination);
  app.node.port.onmessage = onFrame;
  app.playCtx = new AudioContext();
  await openMic();
  await Promise.all([app.captureCtx.resume(), app.playCtx.resume()]);
  listMics();  // device names are readable once the user allowed the microphone
}

async function switchMic() {
  saveSetting("mic");
  if (!app.captureCtx) return;
  if (app.source) app.source.disconnect();
  if (app.stream) app.stream.getTracks().forEach((t) => t.stop());
  try { await openMic(); } catch (err) { banner(`Microphone unavailable: ${err.message}`); }
}

async function listMics() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  const mics = (await navigator.mediaDevices.enumerateDevices()).filter((d) => d.kind === "audioinput");
  const sel = $("mic"), want = sel.value || localStorage.getItem("voicert.mic") || "";
  sel.innerHTML = "";
  sel.appendChild(new Option("default", ""));
  mics.forEach((d, i) => { if (d.deviceId && d.deviceId !== "default") sel.appendChild(new Option(d.label || `microphone ${i + 1}`, d.deviceId)); });
  sel.value = [...sel.options].some((o) => o.value === want) ? want : "";
}

const SILENT_FRAME = new Int16Array(320).buffer;  // 20 ms at 16 kHz

function onFrame(e) {
  app.youLevel = Math.max(app.youLevel, app.muted ? 0 : e.data.peak);
  if (!app.started) return;
  if (app.mode === "push-to-talk" && !app.held && !e.data.last) return;
  // muted: silence keeps the server's clock (and its endpointing) going; your voice does not leave
  const pcm = app.muted ? SILENT_FRAME : e.data.pcm;
  if (send({ type: "audio", audio: toBase64(pcm) })) app.stats.framesSent++;
}

function toggleMute() {
  app.muted = !app.muted;
  $("mute").classList.toggle("on", app.muted);
  $("mute").textContent = app.muted ? "Unmute" : "Mute";
}

function stopAudio() {
  if (app.stream) app.stream.getTracks().forEach((t) => t.stop());
  for (const ctx of [app.captureCtx, app.playCtx]) if (ctx) ctx.close();
  app.stream = app.captureCtx = app.playCtx = app.node = app.source = null;
}

// ------------------------------------------------------------------ audio out

function play(b64) {
  if (!$("speak").checked || !app.playCtx) return;
  const pcm = new Int16Array(fromBase64(b64));
  if (!pcm.length) return;
  const buf = app.playCtx.createBuffer(1, pcm.length, OUT_RATE);
  const ch = buf.getChannelData(0);
  let peak = 0;
  for (let i = 0; i < pcm.length; i++) { ch[i] = pcm[i] / 32768; peak = Math.max(peak, Math.abs(ch[i])); }
  agentLevelAt(Math.max(app.playCtx.currentTime + 0.02, app.playhead), buf.duration, peak);
  const src = app.playCtx.createBufferSource();
  src.buffer = buf;
  src.connect(app.playCtx.destination);
  const at = Math.max(app.playCtx.currentTime + 0.02, app.playhead);
  src.start(at);
  app.playhead = at + buf.duration;
  app.sources.add(src);
  src.onended = () => { app.sources.delete(src); settle(); };
  app.stats.audioChunks++;
  agentState("speaking");
}

function agentLevelAt(at, duration, peak) {
  // the agent's meter moves while its audio plays (not when it arrives)
  const ctx = app.playCtx, startMs = Math.max(0, (at - ctx.currentTime) * 1000);
  setTimeout(() => { app.agentLevel = Math.max(app.agentLevel, peak); }, startMs);
}

// ------------------------------------------------------------------ both sides' audio, drawn

setInterval(() => {  // one level point per side each 50 ms; the levels decay between chunks
  for (const [side, level] of [["you", app.youLevel], ["agent", app.agentLevel]]) {
    const h = app.levels[side];
    h.push(level); h.shift();
  }
  app.youLevel = 0;
  app.agentLevel *= 0.6;
}, 50);

function drawScope(canvas, history, colour) {
  // mirrored bars of the last 8 s of peak level, newest on the right
  const g = canvas.getContext("2d"), w = canvas.width, h = canvas.height, mid = h / 2;
  g.clearRect(0, 0, w, h);
  g.fillStyle = "#2a3340";
  g.fillRect(0, mid - 0.5, w, 1);
  g.fillStyle = colour;
  const step = w / history.length;
  history.forEach((v, i) => {
    const a = Math.min(1, Math.sqrt(v) * 1.2) * (mid - 2);
    if (a > 0.5) g.fillRect(i * step, mid - a, Math.max(1, step - 1), 2 * a);
  });
}

function drawScopes() {
  drawScope($("viz-you"), app.levels.you, "#2f81f7");
  drawScope($("viz-agent"), app.levels.agent, "#a371f7");
  requestAnimationFrame(drawScopes);
}

function stopPlayback() {
  for (const src of app.sources) { try { src.stop(); } catch (_) { /* already stopped */ } }
  app.sources.clear();
  app.playhead = 0;
  app.agentLevel = 0;
}

// ------------------------------------------------------------------ conversation view

function addMessage(cls, who, text) {
  const div = document.createElement("div");
  div.className = `msg ${cls}`;
  div.innerHTML = `<span class="who"></span><span class="text"></span>`;
  div.querySelector(".who").textContent = who;
  div.querySelector(".text").textContent = text;
  $("turns").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function agentEl(turnId) {
  if (!app.agentEls.has(turnId)) app.agentEls.set(turnId, addMessage("agent", "agent", ""));
  return app.agentEls.get(turnId);
}

function toolPanel(turnId, callId, name) {
  // a call as a panel in the reply: its name, its arguments as they are decoded, then its output
  if (app.tools.has(callId)) return app.tools.get(callId);
  const panel = document.createElement("div");
  panel.className = "tool";
  panel.dataset.call = callId;
  panel.dataset.state = "calling";
  panel.innerHTML = '<div class="tool-head"><span class="tool-fn">fn</span><span class="tool-name"></span>' +
    '<span class="tool-state">calling</span></div><pre class="tool-args"></pre><pre class="tool-out"></pre>';
  panel.querySelector(".tool-name").textContent = name;
  panel.title = callId;
  agentEl(turnId).appendChild(panel);
  app.tools.set(callId, panel);
  return panel;
}

function pretty(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function toolState(panel, state, text) {
  panel.dataset.state = state;
  panel.querySelector(".tool-state").textContent = text;
}

function showPartial(stable, unstable) {
  const p = $("partial");
  p.textContent = stable ? `${stable} ` : "";
  const u = document.createElement("span");
  u.className = "unstable";
  u.textContent = unstable;
  p.appendChild(u);
}

function waterfallTotal(stages) {
  return stages.voice_to_first_token_ms || WATERFALL.reduce((a, k) => a + (stages[k] || 0), 0);
}

function drawBar(c, stages) {
  // every turn's bar on one scale (it grows to the slowest turn so far, in 250 ms steps)
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const scale = c.width / app.scaleMs;
  let x = 0;
  for (const k of WATERFALL) {
    const w = Math.max(0, (stages[k] || 0) * scale);
    g.fillStyle = STAGES.colours[k] || "#999"; g.fillRect(x, 0, w, c.height); x += w;
  }
}

function showLegend() {
  $("legend").innerHTML = "";
  for (const k of WATERFALL) {
    const span = document.createElement("span");
    const mark = document.createElement("i");
    mark.style.background = STAGES.colours[k] || "#999";  // (CSSOM: allowed by the page's CSP)
    span.appendChild(mark);
    span.appendChild(document.createTextNode(k.replace(/_ms$/, "")));
    span.title = STAGES.docs[k] || "";
    $("legend").appendChild(span);
  }
  const scale = document.createElement("span");
  scale.id = "scale";
  scale.textContent = `bar width = ${app.scaleMs} ms`;
  $("legend").appendChild(scale);
}

function showLatency(turnId, stages) {
  const row = document.createElement("div");
  row.className = "lat";
  row.dataset.turn = turnId;
  const c = document.createElement("canvas");
  c.width = 260; c.height = 12;
  c.title = WATERFALL.map((k) => `${k.replace("_ms", "")} ${(stages[k] || 0).toFixed(1)} ms`).join("\n");
  const need = Math.ceil(waterfallTotal(stages) / 250) * 250;
  app.latencyRows.push([c, stages]);
  if (need > app.scaleMs) {
    app.scaleMs = need;
    for (const [other, st] of app.latencyRows) drawBar(other, st);
    showLegend();
  } else {
    drawBar(c, stages);
  }
  row.appendChild(c);
  const parts = [["ttft", stages.ttft_ms], ["ttfa", stages.ttfa_ms], ["asr", stages.asr_ms],
                 ["prefill", stages.prefill_ms], ["voice->token", stages.voice_to_first_token_ms]];
  row.appendChild(document.createTextNode(parts.filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k} ${v.toFixed(0)} ms`).join(" · ")));
  const anchor = app.agentEls.get(turnId);
  if (anchor) anchor.after(row); else $("turns").appendChild(row);
  const said = app.transcript.find((m) => m.role === "agent" && m.turn_id === turnId);
  if (said) said.latency_ms = stages;
}

// ------------------------------------------------------------------ thinking indicator

function thinking(on) {
  clearInterval(app.thinkingTimer);
  $("thinking").classList.toggle("show", on);
  if (!on) return;
  app.thinkingSince = performance.now();
  const tick = () => { $("thinking").textContent = `thinking ${Math.round(performance.now() - app.thinkingSince)} ms`; };
  tick();
  app.thinkingTimer = setInterval(tick, 50);
}

// ------------------------------------------------------------------ transcript export

function exportTranscript() {
  const doc = { session_id: app.sessionId, exported_at: new Date().toISOString(),
                server: streamUrl().replace(/token=[^&]*/, "token=..."), messages: app.transcript };
  const blob = new Blob([JSON.stringify(doc, null, 1)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `voicert-${app.sessionId || "conversation"}.json`;
  app.lastExport = doc;  // for tests
  document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function remember(role, text, turnId) {
  app.transcript.push({ role, text, turn_id: turnId === undefined ? null : turnId,
                        at: new Date().toISOString() });
}

function handle(msg) {
  logEvent("in", msg);
  switch (msg.type) {
    case "session.started":
      app.started = true;
      app.sessionId = msg.session_id;
      app.reconnectDelay = 500;
      setStatus("live", "live");
      agentState("listening");
      banner("");
      $("model").value = msg.model || "";
      $("model-name").textContent = msg.model || "";
      listVoices(msg.voices || [], msg.voice);
      break;
    case "vad.speech_started":  // may be a backchannel ("mm-hm"): the reply goes on unless
      if (app.agentState !== "speaking") agentState("hearing");  // vad.barge_in follows
      break;
    case "vad.speech_stopped":  // the endpoint: the turn is over, the reply is on its way
      agentState("heard");
      if (!app.pendingUser) app.pendingUser = addMessage("user pending", "you", "");  // its words follow
      thinking(true);
      break;
    case "vad.barge_in":
      stopPlayback();  // the user talks over the reply: stop speaking at once
      agentState("hearing");
      break;
    case "transcript.partial":
      showPartial(msg.stable, msg.unstable);
      break;
    case "transcript.final":
      showPartial("", "");
      if (msg.text) {
        const el = app.pendingUser || addMessage("user", "you", "");
        el.classList.remove("pending");
        el.querySelector(".text").textContent = msg.text;
        el.scrollIntoView({ block: "end" });
        remember("user", msg.text, msg.turn_id); thinking(true);
        agentState("thinking");
      } else {
        if (app.pendingUser) app.pendingUser.remove();
        thinking(false);
        settle();  // nothing was recognised: no reply follows
      }
      app.pendingUser = null;
      break;
    case "response.started":
      agentEl(msg.turn_id);
      app.replying = true;
      if (app.agentState !== "speaking") agentState("thinking");
      break;
    case "response.token":
      thinking(false);
      agentState("speaking");
      agentEl(msg.turn_id).querySelector(".text").textContent += msg.text;
      break;
    case "response.audio":
      play(msg.audio);
      break;
    case "response.done": {
      thinking(false);
      app.replying = false;
      settle();
      app.stats.turns++;
      const el = agentEl(msg.turn_id);
      el.dataset.done = msg.finish_reason;
      remember("agent", el.querySelector(".text").textContent, msg.turn_id);
      app.transcript[app.transcript.length - 1].finish_reason = msg.finish_reason;
      if (msg.finish_reason === "interrupted" || msg.finish_reason === "cancelled") {
        stopPlayback();
        const tag = document.createElement("span");
        tag.className = "interrupted";
        tag.textContent = `(${msg.finish_reason})`;
        el.appendChild(tag);
      }
      break;
    }
    case "tool.call.started":  // the model calls a tool: shown, never spoken
      toolPanel(msg.turn_id, msg.call_id, msg.name);
      break;
    case "tool.call.delta": {
      const args = toolPanel(msg.turn_id, msg.call_id, "").querySelector(".tool-args");
      args.textContent += msg.delta;
      break;
    }
    case "tool.call": {
      const panel = toolPanel(msg.turn_id, msg.call_id, msg.name);
      panel.querySelector(".tool-name").textContent = msg.name;
      panel.querySelector(".tool-args").textContent = pretty(msg.arguments);
      toolState(panel, msg.server ? "running" : "client", msg.server ? "running on the server" : "for the client");
      break;
    }
    case "tool.output": {
      const panel = toolPanel(msg.turn_id, msg.call_id, "");
      panel.querySelector(".tool-out").textContent = pretty(String(msg.output));
      toolState(panel, msg.error ? "failed" : "done", msg.error ? "failed" : "done");
      break;
    }
    case "turn.latency":
      showLatency(msg.turn_id, msg.stages);
      break;
    case "error":
      thinking(false);
      banner(`server: ${msg.code}: ${msg.message}`);
      if (msg.fatal) agentState("idle");
      break;
  }
}

// ------------------------------------------------------------------ connection

function connect() {
  clearTimeout(app.reconnectTimer);
  setStatus("connecting...", "wait");
  let ws;
  try {
    ws = new WebSocket(streamUrl());
  } catch (err) {  // a server field the browser cannot make a URL of
    banner(`Server: ${err.message}`);
    stop();
    return;
  }
  app.ws = ws;
  agentState("connecting");
  ws.onopen = () => {
    const ptt = app.mode === "push-to-talk";
    const options = { turn_detection: ptt ? "manual" : "server_vad",
                      output_audio: $("speak").checked ? { encoding: "pcm16", sample_rate: OUT_RATE } : null };
    const prompt = $("system-prompt").value.trim(), maxTokens = parseInt($("max-tokens").value, 10);
    if (maxTokens > 0) options.max_new_tokens = maxTokens;
    const endOfTurn = $("end-of-turn").value, silence = parseInt($("silence-ms").value, 10);
    const threshold = parseFloat($("vad-threshold").value);
    if (endOfTurn) options.end_of_turn = endOfTurn;
    if (silence > 0) options.silence_ms = silence;
    if (threshold > 0 && threshold < 1) options.vad_threshold = threshold;
    send({ type: "session.start", protocol_version: 1, sample_rate: 16000, encoding: "pcm16", options,
           ...(prompt ? { system_prompt: prompt } : {}) });
  };
  ws.onmessage = (e) => { try { handle(JSON.parse(e.data)); } catch (err) { console.error(err); } };
  ws.onclose = (e) => {
    if (app.ws !== ws) return;
    app.started = false;
    app.replying = false;
    if (app.pendingUser) { app.pendingUser.remove(); app.pendingUser = null; }
    thinking(false);
    stopPlayback();
    agentState(app.running ? "connecting" : "idle");
    if (!app.running) { setStatus("disconnected", "down"); return; }
    const wait = app.reconnectDelay;
    app.reconnectDelay = Math.min(app.reconnectDelay * 2, 8000);
    app.stats.reconnects++;
    setStatus("reconnecting", "down");
    banner(`Connection lost (${e.code}${e.reason ? ": " + e.reason : ""}). Reconnecting in ${(wait / 1000).toFixed(1)} s... ` +
           "(a new connection starts a new conversation)");
    app.reconnectTimer = setTimeout(connect, wait);
  };
}

async function start() {
  $("start").disabled = true;
  try {
    await startAudio();
  } catch (err) {
    banner(`Microphone unavailable: ${err.message}. You can still type.`);
  }
  app.running = true;
  app.t0 = performance.now();
  $("stop").disabled = false;
  $("mute").disabled = false;
  $("send").disabled = false;
  $("ptt").disabled = app.mode !== "push-to-talk";
  connect();
}

function stop() {
  app.running = false;
  clearTimeout(app.reconnectTimer);
  if (app.ws) { send({ type: "session.end" }); app.ws.close(1000); }
  stopAudio();
  stopPlayback();
  banner("");
  $("start").disabled = false;
  $("stop").disabled = true;
  $("mute").disabled = true;
  $("ptt").disabled = true;
  $("send").disabled = true;
  thinking(false);
  agentState("idle");
  setStatus("stopped", "idle");
}

function pttDown() {
  if (app.mode !== "push-to-talk" || app.held || !app.started) return;
  app.held = true;
  stopPlayback();
  $("ptt").classList.add("held");
}

function pttUp() {
  if (!app.held) return;
  app.held = false;
  $("ptt").classList.remove("held");
  if (app.node) app.node.port.postMessage("flush");
  setTimeout(() => send({ type: "audio.commit" }), 60);  // after the flushed last frame
}

$("start").onclick = start;
$("stop").onclick = stop;
$("mute").onclick = toggleMute;
$("export").onclick = exportTranscript;
$("mic").onchange = switchMic;
for (const id of ["server-url", "token", "max-tokens", "end-of-turn", "silence-ms", "vad-threshold"]) {
  $(id).onchange = () => saveSetting(id);
}
$("voice").onchange = () => {
  saveSetting("voice");
  if (app.started && $("voice").value) send({ type: "session.update", voice: $("voice").value });
};
$("system-prompt").onchange = () => {
  saveSetting("system-prompt");
  if (!app.started) return;
  const prompt = $("system-prompt").value.trim();
  if (prompt) send({ type: "session.update", system_prompt: prompt });
  else banner("The server's own system prompt comes back with the next Start (a new conversation); " +
              "this one keeps the prompt it has.");  // said, not silently ignored
};
$("ptt").onmousedown = pttDown; $("ptt").onmouseup = pttUp; $("ptt").onmouseleave = pttUp;
$("ptt").ontouchstart = (e) => { e.preventDefault(); pttDown(); };
$("ptt").ontouchend = (e) => { e.preventDefault(); pttUp(); };
document.addEventListener("keydown", (e) => { if (e.code === "Space" && e.target.tagName !== "INPUT") { e.preventDefault(); pttDown(); } });
document.addEventListener("keyup", (e) => { if (e.code === "Space" && e.target.tagName !== "INPUT") pttUp(); });
for (const r of document.querySelectorAll("input[name=mode]")) {
  r.onchange = () => {
    app.mode = r.value;
    $("ptt").disabled = !app.running || app.mode !== "push-to-talk";
    if (app.running && app.ws) { app.started = false; app.ws.close(1000); app.ws = null; connect(); }  // new mode, new session
  };
}
$("typed").onsubmit = (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text || !send({ type: "user.text", text })) return;
  addMessage("user", "you", text);
  remember("user", text);
  thinking(true);
  agentState("thinking");
  $("text").value = "";
};
$("event-filter").oninput = filterEvents;
$("show-in").onchange = filterEvents;
$("show-out").onchange = filterEvents;
loadSettings();
showLegend();
listMics();
requestAnimationFrame(drawScopes);
if (new URLSearchParams(location.search).get("autostart") === "1") start();
