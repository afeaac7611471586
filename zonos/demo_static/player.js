// The web demo's player (gradio_interface.py serves it at zonos/player.js): posts the controls to the stream
// route and schedules each PCM chunk on an AudioContext as it arrives. No decoder, no media element and no
// segment buffering between a chunk's arrival and its playback.
// window.zonosPlayer.stats holds what the page measured; the browser test and benchmarks/demo_latency.py read it.
(() => {
  "use strict";
  const HEADER = 8; // little-endian uint32 kind, uint32 payload bytes (gradio_interface.FRAME_HEADER)
  const EVENT = 1;
  const PCM = 2;
  const LATE_S = 0.005; // a chunk due this far in the past starts now: an underrun (heard as a gap)

  const $ = (id) => document.getElementById(id);

  // The status line is a live region: screen readers read each update, an error at once. Its kind (busy, done,
  // warning, error) styles it, so an error does not look like a result.
  function say(kind, text) {
    const el = $("zonos-status");
    if (!el) return;
    el.dataset.kind = kind;
    el.setAttribute("aria-live", kind === "error" ? "assertive" : "polite");
    el.textContent = text;
  }

  function showLine(id, text) {
    const el = $(id);
    if (el) el.textContent = text;
  }

  // null hides the bar; undefined shows it without a value (indeterminate: queued or conditioning).
  function showProgress(fraction, label) {
    const bar = $("zonos-progress");
    if (!bar) return;
    bar.hidden = fraction === null;
    if (fraction === null || fraction === undefined) bar.removeAttribute("value");
    else bar.value = Math.min(1, Math.max(0, fraction));
    if (label) bar.setAttribute("aria-valuetext", label);
  }

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  let clickAt = null; // the Generate click's event time: the latency counts from the user's press
  document.addEventListener(
    "click",
    (e) => {
      if (e.target instanceof Element && e.target.closest("#zonos-generate")) clickAt = e.timeStamp;
    },
    true,
  );

  class Player {
    constructor() {
      this.ctx = null;
      this.abort = null;
      this.sources = new Set();
      this.stats = this.fresh();
    }

    fresh() {
      return {
        requests: 0,
        clickAt: null, // performance.now() ms
        firstScheduledAt: null, // performance.now() ms when the first sample was handed to the audio graph
        firstScheduledWallMs: null, // Date.now() of the same moment, comparable with the server's clock
        clickToFetchMs: null, // click to the request leaving the page
        clickToResponseMs: null, // click to the response's first bytes (its first audio, or its place in line)
        clickToFirstAudioMs: null,
        outputLatencyMs: null, // the context's base + output latency: the sound leaves the speaker this later
        serverTtfaMs: null,
        serverRunningAtFirstAudio: null, // no done event had arrived when the first sample was scheduled
        serverEndWallMs: null,
        samplesScheduled: 0,
        chunks: 0,
        underruns: 0,
        sampleRate: null,
        seed: null,
        prefixFrames: null, // frames of the uploaded prefix clip, which play first
        segments: null, // text segments the server speaks as one utterance
        queuedAhead: null, // the most requests that were ahead of this one in line
        progress: 0, // fraction of the most frames the request may take
        cutOff: false, // a segment stopped at its frame budget, not at the model's end
        state: "idle", // idle | streaming | done | stopped | error
        message: "",
      };
    }

    audio() {
      if (!this.ctx) this.ctx = new AudioContext({ latencyHint: "interactive", sampleRate: 44100 });
      if (this.ctx.state !== "running") this.ctx.resume();
      return this.ctx;
    }

    // Generate's handler. The promise it returns is the Seed box's new value (Gradio writes it there): the seed
    // the server used once the stream starts, so unticking "Randomize seed" repeats this request; the seed as it
    // was when the request ends without starting.
    start(names, values) {
      let resolve;
      const used = new Promise((r) => {
        resolve = r;
      });
      this.onSeed = resolve;
      this.run(names, values).finally(() => resolve(values[names.indexOf("seed")]));
      return used;
    }

    async run(names, values) {
      const clicked = clickAt !== null && performance.now() - clickAt < 1000 ? clickAt : performance.now();
      clickAt = null;
      this.halt();
      const requests = this.stats.requests + 1;
      this.stats = this.fresh();
      Object.assign(this.stats, { requests, clickAt: clicked, state: "streaming" });
      const stats = this.stats;
      const body = {};
      names.forEach((name, i) => {
        body[name] = values[i];
      });
      const abort = new AbortController();
      this.abort = abort;
      stats.clickToFetchMs = performance.now() - clicked;
      const response = fetch("zonos/stream", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: abort.signal,
      });
      // While the server works: the audio graph (resuming is allowed inside the click's activation).
      this.audio();
      this.next = 0;
      this.pcm = [];
      $("zonos-replay")?.setAttribute("hidden", "");
      $("zonos-download")?.setAttribute("hidden", "");
      say("busy", "Generating…");
      showProgress(undefined, "starting");
      showLine("zonos-latency", "");
      try {
        const resp = await response;
        if (!resp.ok) {
          let message = `HTTP ${resp.status}`;
          try {
            message = (await resp.json()).error || message;
          } catch (_) {}
          return this.fail(stats, message);
        }
        stats.clickToResponseMs = performance.now() - clicked;
        await this.read(resp.body.getReader(), stats, abort);
        if (stats.state === "streaming") this.fail(stats, "the stream ended early");
      } catch (err) {
        if (stats.state === "streaming") this.fail(stats, String(err));
      }
    }

    async read(reader, stats, abort) {
      let buf = new Uint8Array(0);
      for (;;) {
        const { value, done } = await reader.read();
        if (done || abort.signal.aborted) return;
        const joined = new Uint8Array(buf.length + value.length);
        joined.set(buf);
        joined.set(value, buf.length);
        buf = joined;
        let pos = 0;
        const view = new DataView(buf.buffer);
        while (buf.length - pos >= HEADER) {
          const kind = view.getUint32(pos, true);
          const size = view.getUint32(pos + 4, true);
          if (buf.length - pos - HEADER < size) break;
          const payload = buf.slice(pos + HEADER, pos + HEADER + size); // a copy: aligned for Float32Array
          pos += HEADER + size;
          if (kind === PCM) this.play(new Float32Array(payload.buffer), stats);
          else if (kind === EVENT) this.event(JSON.parse(new TextDecoder().decode(payload)), stats);
        }
        buf = buf.slice(pos);
      }
    }

    play(samples, stats) {
      if (stats !== this.stats || stats.state !== "streaming" || samples.length === 0) return;
      const ctx = this.ctx;
      const rate = stats.sampleRate || 44100;
      const buffer = ctx.createBuffer(1, samples.length, rate);
      buffer.copyToChannel(samples, 0);
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(ctx.destination);
      let when = this.next;
      if (when < ctx.currentTime + LATE_S) {
        if (stats.chunks > 0) stats.underruns += 1;
        when = ctx.currentTime;
      }
      source.start(when);
      this.sources.add(source);
      source.onended = () => this.sources.delete(source);
      this.next = when + buffer.duration;
      this.pcm.push(samples);
      stats.chunks += 1;
      stats.samplesScheduled += samples.length;
      if (stats.firstScheduledAt === null) {
        stats.firstScheduledAt = performance.now();
        stats.firstScheduledWallMs = Date.now();
        stats.clickToFirstAudioMs = stats.firstScheduledAt - stats.clickAt;
        stats.outputLatencyMs = 1000 * ((ctx.baseLatency || 0) + (ctx.outputLatency || 0));
        stats.serverRunningAtFirstAudio = stats.serverEndWallMs === null;
        this.showLatency(stats);
      }
    }

    showLatency(stats) {
      const parts = [`first audio ${stats.clickToFirstAudioMs.toFixed(0)} ms after the click (browser)`];
      if (stats.serverTtfaMs !== null) parts.push(`server ${stats.serverTtfaMs.toFixed(0)} ms`);
      if (stats.outputLatencyMs) parts.push(`+${stats.outputLatencyMs.toFixed(0)} ms output latency`);
      if (stats.underruns) parts.push(`${plural(stats.underruns, "gap")}`);
      showLine("zonos-latency", parts.join(" · "));
    }

    event(ev, stats) {
      if (stats !== this.stats) return;
      if (ev.event === "queued") {
        stats.queuedAhead = Math.max(stats.queuedAhead || 0, ev.ahead);
        say("busy", `Waiting for the model: ${plural(ev.ahead, "request")} ahead of yours…`);
        showProgress(undefined, "waiting in line");
      } else if (ev.event === "start") {
        Object.assign(stats, {
          sampleRate: ev.sample_rate,
          seed: ev.seed,
          prefixFrames: ev.prefix_frames,
          segments: ev.segments,
        });
        this.onSeed(ev.seed);
        const parts = ev.segments > 1 ? ` · ${ev.segments} segments` : "";
        say("busy", `Generating on ${ev.device} · seed ${ev.seed}${parts}…`);
        showProgress(0, "generating");
      } else if (ev.event === "first_audio") {
        stats.serverTtfaMs = ev.ttfa_ms;
      } else if (ev.event === "progress") {
        stats.progress = ev.fraction;
        const where = ev.segments > 1 ? `segment ${ev.segment} of ${ev.segments}` : "generating";
        showProgress(ev.fraction, `${where}, ${Math.round(100 * ev.fraction)}%`);
      } else if (ev.event === "done") {
        stats.serverEndWallMs = ev.t_end_wall_ms;
        if (stats.state !== "streaming") return;
        stats.state = ev.stopped ? "stopped" : "done";
        stats.cutOff = Boolean(ev.warning);
        showProgress(null);
        const timing =
          `${ev.seconds.toFixed(2)} s of audio in ${ev.elapsed_s.toFixed(2)} s ` +
          `(${ev.rtf.toFixed(2)}× real time) · seed ${ev.seed}`;
        if (ev.samples === 0) {
          say("warning", `No audio: the model ended at once (seed ${ev.seed}); try another seed or longer text.`);
        } else if (ev.warning) {
          say("warning", `Cut off: ${ev.warning} ${timing}`);
        } else {
          say("done", `Done: ${timing}`);
        }
        if (stats.firstScheduledAt !== null) this.showLatency(stats);
        this.offerReplay(stats);
      } else if (ev.event === "error") {
        this.fail(stats, ev.message);
      }
    }

    fail(stats, message) {
      if (stats !== this.stats) return;
      stats.state = "error";
      stats.message = message;
      showProgress(null);
      say("error", `Error: ${message}`);
    }

    halt() {
      if (this.abort) this.abort.abort(); // the server sees the closed connection and stops generating
      this.abort = null;
      for (const source of this.sources) {
        try {
          source.stop();
        } catch (_) {}
      }
      this.sources.clear();
    }

    stop() {
      const stats = this.stats;
      this.halt();
      if (stats.state !== "streaming") return;
      stats.state = "stopped";
      showProgress(null);
      const seconds = stats.samplesScheduled / (stats.sampleRate || 44100);
      say("done", `Stopped after ${seconds.toFixed(2)} s of audio; the model is ready for the next request.`);
      this.offerReplay(stats);
    }

    offerReplay(stats) {
      if (!this.pcm.length) return;
      const url = URL.createObjectURL(wav(this.pcm, stats.sampleRate || 44100));
      for (const id of ["zonos-replay", "zonos-download"]) {
        const el = $(id);
        if (!el) continue;
        if (el.dataset.url) URL.revokeObjectURL(el.dataset.url);
        el.dataset.url = url;
        el.setAttribute(id === "zonos-replay" ? "src" : "href", url);
        el.removeAttribute("hidden");
      }
    }

    // The character counter under the text box (the text box's change event calls it, typed or from an example).
    count(text) {
      const el = $("zonos-chars");
      if (!el) return;
      const n = [...text].length; // code points, as Python's len() counts them on the server
      const max = Number(el.dataset.max);
      const long = n > Number(el.dataset.segment) ? " · spoken in segments, as one utterance" : "";
      el.textContent = `${n.toLocaleString("en")} / ${max.toLocaleString("en")} characters${long}`;
      el.dataset.kind = n > max ? "error" : "";
      const box = document.querySelector("#zonos-text textarea");
      if (box) box.setAttribute("aria-describedby", "zonos-chars");
    }
  }

  // A mono 16-bit wav file of the float chunks (for replay and download).
  function wav(chunks, rate) {
    const n = chunks.reduce((a, c) => a + c.length, 0);
    const out = new DataView(new ArrayBuffer(44 + 2 * n));
    const text = (pos, s) => [...s].forEach((ch, i) => out.setUint8(pos + i, ch.charCodeAt(0)));
    text(0, "RIFF");
    out.setUint32(4, 36 + 2 * n, true);
    text(8, "WAVEfmt ");
    out.setUint32(16, 16, true);
    out.setUint16(20, 1, true);
    out.setUint16(22, 1, true);
    out.setUint32(24, rate, true);
    out.setUint32(28, 2 * rate, true);
    out.setUint16(32, 2, true);
    out.setUint16(34, 16, true);
    text(36, "data");
    out.setUint32(40, 2 * n, true);
    let pos = 44;
    for (const c of chunks) {
      for (let i = 0; i < c.length; i++, pos += 2) {
        out.setInt16(pos, Math.round(32767 * Math.max(-1, Math.min(1, c[i]))), true);
      }
    }
    return new Blob([out.buffer], { type: "audio/wav" });
  }

  window.zonosPlayer = new Player();
  // Opening an AudioContext blocks the page for 200-300 ms in chromium (the audio device starts): do it while
  // the page is idle, not between a click and its request. It stays suspended until the click resumes it.
  setTimeout(() => window.zonosPlayer.audio(), 0);
})();
