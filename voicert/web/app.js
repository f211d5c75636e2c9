// voicert browser client: microphone -> AudioWorklet (16 kHz PCM16, 20 ms frames) -> /v1/stream
// (JSON text frames of the native protocol, docs/protocol.md); live partial transcripts, the reply
// as it streams, its speech played as it arrives, and each turn's latency waterfall.
// No build step, no CDN. window.voicert exposes the state for tests and debugging.
"use strict";

const WATERFALL = ["endpoint_ms", "asr_ms", "dispatch_ms", "queue_ms", "prefill_ms", "handoff_ms", "send_ms"];
const COLORS = ["#8c8c8c", "#1f77b4", "#17becf", "#bcbd22", "#ff7f0e", "#9467bd", "#2ca02c"];
const OUT_RATE = 24000;  // the reply's speech: pcm16 at 24 kHz
const $ = (id) => document.getElementById(id);

const app = {
  ws: null, running: false, started: false, mode: "hands-free", held: false,
  stream: null, captureCtx: null, playCtx: null, node: null,
  playhead: 0, sources: new Set(), agentEls: new Map(), reconnectDelay: 500, reconnectTimer: null,
  stats: { framesSent: 0, audioChunks: 0, reconnects: 0, turns: 0 },
};
window.voicert = app;

function setStatus(text, cls) { const s = $("status"); s.textContent = text; s.className = cls; }
function banner(text) { const b = $("banner"); b.textContent = text || ""; b.classList.toggle("show", !!text); }

function streamUrl() {
  const token = new URLSearchParams(location.search).get("token");  // when the server wants one
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}/v1/stream` + (token ? `?token=${encodeURIComponent(token)}` : "");
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
  if (app.ws && app.ws.readyState === WebSocket.OPEN) { app.ws.send(JSON.stringify(msg)); return true; }
  return false;
}

// ------------------------------------------------------------------ audio in

async function startAudio() {
  app.stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true } });
  app.captureCtx = new AudioContext({ sampleRate: 16000 });  // the browser resamples the mic for us
  await app.captureCtx.audioWorklet.addModule("/capture-worklet.js");
  const source = app.captureCtx.createMediaStreamSource(app.stream);
  app.node = new AudioWorkletNode(app.captureCtx, "voicert-capture");
  const mute = app.captureCtx.createGain();
  mute.gain.value = 0;  // keep the node pulled by the graph without echoing the mic
  source.connect(app.node).connect(mute).connect(app.captureCtx.destination);
  app.node.port.onmessage = onFrame;
  app.playCtx = new AudioContext();
  await Promise.all([app.captureCtx.resume(), app.playCtx.resume()]);
}

function onFrame(e) {
  $("meter").firstElementChild.style.width = `${Math.min(100, e.data.peak * 300)}%`;
  if (!app.started) return;
  if (app.mode === "push-to-talk" && !app.held && !e.data.last) return;
  if (send({ type: "audio", audio: toBase64(e.data.pcm) })) app.stats.framesSent++;
}

function stopAudio() {
  if (app.stream) app.stream.getTracks().forEach((t) => t.stop());
  for (const ctx of [app.captureCtx, app.playCtx]) if (ctx) ctx.close();
  app.stream = app.captureCtx = app.playCtx = app.node = null;
}

// ------------------------------------------------------------------ audio out

function play(b64) {
  if (!$("speak").checked || !app.playCtx) return;
  const pcm = new Int16Array(fromBase64(b64));
  if (!pcm.length) return;
  const buf = app.playCtx.createBuffer(1, pcm.length, OUT_RATE);
  const ch = buf.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;
  const src = app.playCtx.createBufferSource();
  src.buffer = buf;
  src.connect(app.playCtx.destination);
  const at = Math.max(app.playCtx.currentTime + 0.02, app.playhead);
  src.start(at);
  app.playhead = at + buf.duration;
  app.sources.add(src);
  src.onended = () => app.sources.delete(src);
  app.stats.audioChunks++;
}

function stopPlayback() {
  for (const src of app.sources) { try { src.stop(); } catch (_) { /* already stopped */ } }
  app.sources.clear();
  app.playhead = 0;
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

function toolLine(turnId, text, callId, failed) {
  const line = document.createElement("div");
  line.className = failed ? "tool failed" : "tool";
  line.textContent = text;
  line.title = callId;
  agentEl(turnId).appendChild(line);
}

function showPartial(stable, unstable) {
  const p = $("partial");
  p.textContent = stable ? `${stable} ` : "";
  const u = document.createElement("span");
  u.className = "unstable";
  u.textContent = unstable;
  p.appendChild(u);
}

function showLatency(turnId, stages) {
  const row = document.createElement("div");
  row.className = "lat";
  row.dataset.turn = turnId;
  const total = stages.voice_to_first_token_ms || WATERFALL.reduce((a, k) => a + (stages[k] || 0), 0);
  const c = document.createElement("canvas");
  c.width = 320; c.height = 12;
  const g = c.getContext("2d");
  const scale = c.width / Math.max(total, 200);
  let x = 0;
  WATERFALL.forEach((k, i) => {
    const w = Math.max(0, (stages[k] || 0) * scale);
    g.fillStyle = COLORS[i]; g.fillRect(x, 0, w, c.height); x += w;
  });
  c.title = WATERFALL.map((k) => `${k.replace("_ms", "")} ${(stages[k] || 0).toFixed(1)} ms`).join("\n");
  row.appendChild(c);
  const parts = [["ttft", stages.ttft_ms], ["ttfa", stages.ttfa_ms], ["asr", stages.asr_ms],
                 ["prefill", stages.prefill_ms], ["voice->token", stages.voice_to_first_token_ms]];
  row.appendChild(document.createTextNode(parts.filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k} ${v.toFixed(0)} ms`).join(" · ")));
  const anchor = app.agentEls.get(turnId);
  if (anchor) anchor.after(row); else $("turns").appendChild(row);
}

function handle(msg) {
  switch (msg.type) {
    case "session.started":
      app.started = true;
      app.reconnectDelay = 500;
      setStatus("live", "live");
      banner("");
      break;
    case "vad.speech_started":
      break;  // may be a backchannel ("mm-hm"): the reply goes on unless vad.barge_in follows
    case "vad.barge_in":
      stopPlayback();  // the user talks over the reply: stop speaking at once
      break;
    case "transcript.partial":
      showPartial(msg.stable, msg.unstable);
      break;
    case "transcript.final":
      showPartial("", "");
      if (msg.text) addMessage("user", "you", msg.text);
      break;
    case "response.started":
      agentEl(msg.turn_id);
      break;
    case "response.token":
      agentEl(msg.turn_id).querySelector(".text").textContent += msg.text;
      break;
    case "response.audio":
      play(msg.audio);
      break;
    case "response.done": {
      app.stats.turns++;
      const el = agentEl(msg.turn_id);
      el.dataset.done = msg.finish_reason;
      if (msg.finish_reason === "interrupted" || msg.finish_reason === "cancelled") {
        stopPlayback();
        const tag = document.createElement("span");
        tag.className = "interrupted";
        tag.textContent = `(${msg.finish_reason})`;
        el.appendChild(tag);
      }
      break;
    }
    case "tool.call":  // the model called a tool: shown, never spoken
      toolLine(msg.turn_id, `${msg.name}(${msg.arguments})`, msg.call_id);
      break;
    case "tool.output":
      toolLine(msg.turn_id, `\u2192 ${msg.output.slice(0, 200)}`, msg.call_id, msg.error);
      break;
    case "turn.latency":
      showLatency(msg.turn_id, msg.stages);
      break;
    case "error":
      banner(`server: ${msg.code}: ${msg.message}`);
      break;
  }
}

// ------------------------------------------------------------------ connection

function connect() {
  clearTimeout(app.reconnectTimer);
  setStatus("connecting...", "wait");
  const ws = new WebSocket(streamUrl());
  app.ws = ws;
  ws.onopen = () => {
    const ptt = app.mode === "push-to-talk";
    send({ type: "session.start", protocol_version: 1, sample_rate: 16000, encoding: "pcm16",
           options: { turn_detection: ptt ? "manual" : "server_vad",
                      output_audio: $("speak").checked ? { encoding: "pcm16", sample_rate: OUT_RATE } : null } });
  };
  ws.onmessage = (e) => { try { handle(JSON.parse(e.data)); } catch (err) { console.error(err); } };
  ws.onclose = (e) => {
    if (app.ws !== ws) return;
    app.started = false;
    stopPlayback();
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
  $("stop").disabled = false;
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
  $("ptt").disabled = true;
  $("send").disabled = true;
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
  $("text").value = "";
};
if (new URLSearchParams(location.search).get("autostart") === "1") start();
