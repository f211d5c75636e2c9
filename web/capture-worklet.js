// AudioWorklet: microphone samples (the capture AudioContext runs at 16 kHz, so the browser has
// already resampled) -> 20 ms frames of little-endian PCM16, posted to the page with the frame's
// peak level. Runs on the audio rendering thread; keep it allocation-light.
class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.frame = new Int16Array(320);  // 20 ms at 16 kHz
    this.fill = 0;
    this.peak = 0;
    this.port.onmessage = (e) => { if (e.data === "flush") this.flush(true); };
  }
  flush(last = false) {  // last: the page asked for the partial frame (end of push-to-talk)
    if (this.fill === 0) return;
    const out = this.frame.slice(0, this.fill);
    this.port.postMessage({ pcm: out.buffer, peak: this.peak, last }, [out.buffer]);
    this.fill = 0;
    this.peak = 0;
  }
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (!ch) return true;
    for (let i = 0; i < ch.length; i++) {
      const s = Math.max(-1, Math.min(1, ch[i]));
      this.peak = Math.max(this.peak, Math.abs(s));
      this.frame[this.fill++] = s < 0 ? s * 0x8000 : s * 0x7fff;
      if (this.fill === this.frame.length) this.flush();
    }
    return true;
  }
}
registerProcessor("voicert-capture", CaptureProcessor);
