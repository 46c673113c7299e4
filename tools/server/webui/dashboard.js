// The dashboard: polls the server's Prometheus /metrics (vLLM's metric names, tools/server/metrics.c)
// while its tab is open, parses the text exposition format, and shows the figures of the last poll in
// tiles and the last WINDOW polls as small plots on <canvas>. Gauges are shown as read; rates come
// from two successive polls (a counter's increase over the time between them), and TTFT / TPOT are the
// mean of the requests observed in that interval (the histograms' _sum and _count increases).
"use strict";

const OspreyDashboard = (() => {
  const $ = (id) => document.getElementById(id);
  const WINDOW = 120;
  let interval = 1000;  // ms between polls (?poll=MS in the page's address overrides; 100 .. 3,600,000)
  let timer = null, prev = null, inflight = false;
  const series = { running: [], waiting: [], kv: [], hit: [], engineTps: [], genTps: [], ttft: [], tpot: [] };

  // Prometheus text format 0.0.4 -> Map(name -> [{labels: {k: v}, value}]). Comments, blank lines and
  // malformed lines (no value, a value that is not a number) are skipped.
  function parse(text) {
    const out = new Map();
    const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$/;
    const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = LINE.exec(line);
      if (!m) continue;
      const labels = {};
      if (m[2]) for (const l of m[2].matchAll(LABEL)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
      const v = m[3] === "+Inf" || m[3] === "Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : Number(m[3]);
      if (Number.isNaN(v) && m[3] !== "NaN") continue; // not a sample line
      if (!out.has(m[1])) out.set(m[1], []);
      out.get(m[1]).push({ labels, value: v });
    }
    return out;
  }

  // The sum of a metric's samples (over its label sets), or null when the server does not export it.
  function value(metrics, name) {
    const s = metrics.get(name);
    if (!s) return null;
    return s.reduce((a, x) => a + x.value, 0);
  }

  function sample(metrics, t) {
    return {
      t,
      running: value(metrics, "vllm:num_requests_running"),
      waiting: value(metrics, "vllm:num_requests_waiting"),
      kv: value(metrics, "vllm:kv_cache_usage_perc"),
      hits: value(metrics, "vllm:prefix_cache_hits_total"),
      queries: value(metrics, "vllm:prefix_cache_queries_total"),
      gen: value(metrics, "vllm:generation_tokens_total"),
      stepTokens: value(metrics, "vllm:iteration_tokens_total_sum"),
      ttftSum: value(metrics, "vllm:time_to_first_token_seconds_sum"),
      ttftCount: value(metrics, "vllm:time_to_first_token_seconds_count"),
      tpotSum: value(metrics, "vllm:time_per_output_token_seconds_sum"),
      tpotCount: value(metrics, "vllm:time_per_output_token_seconds_count"),
      done: value(metrics, "vllm:request_success_total"),
    };
  }

  // A counter's increase from a to b (null if either is missing or it went down: a restart).
  const inc = (a, b) => (a === null || b === null || b < a ? null : b - a);

  function push(name, v) {
    const s = series[name];
    s.push(v);
    if (s.length > WINDOW) s.shift();
  }

  const fmt = (v, digits, unit) => (v === null || v === undefined || !Number.isFinite(v) ? "–" : v.toFixed(digits) + (unit || ""));

  function update(cur) {
    const dt = prev ? (cur.t - prev.t) / 1000 : 0;
    const rate = (a, b) => { const d = prev && dt > 0 ? inc(a, b) : null; return d === null ? null : d / dt; };
    const mean = (s0, s1, c0, c1) => { const ds = inc(s0, s1), dc = inc(c0, c1); return ds === null || !dc ? null : ds / dc; };
    const engineTps = rate(prev && prev.stepTokens, cur.stepTokens);
    const genTps = rate(prev && prev.gen, cur.gen);
    const dq = prev ? inc(prev.queries, cur.queries) : null, dh = prev ? inc(prev.hits, cur.hits) : null;
    const hit = dq ? (100 * dh) / dq : null;
    const ttft = prev ? mean(prev.ttftSum, cur.ttftSum, prev.ttftCount, cur.ttftCount) : null;
    const tpot = prev ? mean(prev.tpotSum, cur.tpotSum, prev.tpotCount, cur.tpotCount) : null;

    push("running", cur.running);
    push("waiting", cur.waiting);
    push("kv", cur.kv === null ? null : 100 * cur.kv);
    push("hit", hit);
    push("engineTps", engineTps);
    push("genTps", genTps);
    push("ttft", ttft === null ? null : 1000 * ttft);
    push("tpot", tpot === null ? null : 1000 * tpot);

    $("m-running").textContent = fmt(cur.running, 0);
    $("m-waiting").textContent = fmt(cur.waiting, 0);
    $("m-kv").textContent = fmt(cur.kv === null ? null : 100 * cur.kv, 1, " %");
    $("m-hit").textContent = cur.queries ? fmt((100 * cur.hits) / cur.queries, 1, " %") : "–";
    $("m-hit").title = "all time: hit tokens / queried tokens";
    if (prev) {
      $("m-engine-tps").textContent = fmt(engineTps, 1);
      $("m-gen-tps").textContent = fmt(genTps, 1);
    }
    const lastOf = (s) => { for (let i = s.length - 1; i >= 0; i--) if (s[i] !== null) return s[i]; return null; };
    $("m-ttft").textContent = fmt(lastOf(series.ttft), 0, " ms");
    $("m-tpot").textContent = fmt(lastOf(series.tpot), 1, " ms");
    $("m-gen-total").textContent = fmt(cur.gen, 0);
    $("m-done").textContent = fmt(cur.done, 0);
    prev = cur;
    draw();
  }

  // ---- plots -------------------------------------------------------------------------------
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";

  // Draws lines (arrays of numbers or null = no value: a gap) on canvas, left to right over WINDOW
  // slots, newest at the right edge; the y axis from 0 to a rounded maximum, labelled.
  function plot(canvas, lines, opts) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (!w || !h) return;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    let max = opts.min || 1;
    for (const s of lines) for (const v of s) if (v !== null && Number.isFinite(v) && v > max) max = v;
    const mag = Math.pow(10, Math.floor(Math.log10(max)));
    max = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((x) => x >= max) || max;
    const left = 40, top = 6, bottom = 14, right = 4;
    const pw = w - left - right, ph = h - top - bottom;
    g.font = "10px " + css("--mono");
    g.fillStyle = css("--muted");
    g.strokeStyle = css("--grid");
    g.lineWidth = 1;
    g.textAlign = "right";
    g.textBaseline = "middle";
    for (let k = 0; k <= 4; k++) {
      const y = top + ph - (k / 4) * ph;
      g.beginPath();
      g.moveTo(left, Math.round(y) + 0.5);
      g.lineTo(left + pw, Math.round(y) + 0.5);
      g.stroke();
      const v = (k / 4) * max;
      g.fillText(v >= 100 ? v.toFixed(0) : String(+v.toPrecision(3)), left - 4, y);
    }
    g.textAlign = "left";
    g.textBaseline = "alphabetic";
    g.fillText(`−${Math.round((WINDOW * interval) / 1000)} s`, left, h - 2);
    g.textAlign = "right";
    g.fillText("now", left + pw, h - 2);
    const step = pw / (WINDOW - 1);
    lines.forEach((s, li) => {
      g.strokeStyle = css("--c" + li);
      g.lineWidth = 1.5;
      g.beginPath();
      let pen = false;
      const x0 = left + pw - (s.length - 1) * step;
      s.forEach((v, i) => {
        if (v === null || !Number.isFinite(v)) { pen = false; return; }
        const x = x0 + i * step, y = top + ph - (Math.min(v, max) / max) * ph;
        if (pen) g.lineTo(x, y);
        else { g.moveTo(x, y); if (s[i + 1] === null || i === s.length - 1) g.fillRect(x - 1, y - 1, 2, 2); }
        pen = true;
      });
      g.stroke();
    });
  }

  function draw() {
    plot($("plot-requests"), [series.running, series.waiting], { min: 1 });
    plot($("plot-kv"), [series.kv], { min: 1 });
    plot($("plot-hit"), [series.hit], { min: 100 });
    plot($("plot-tps"), [series.engineTps, series.genTps], { min: 1 });
    plot($("plot-ttft"), [series.ttft], { min: 1 });
    plot($("plot-tpot"), [series.tpot], { min: 1 });
  }

  // ---- polling -----------------------------------------------------------------------------
  async function poll() {
    if (inflight) return;
    inflight = true;
    const view = $("view-dashboard");
    try {
      const resp = await fetch("/metrics", { cache: "no-store" });
      if (!resp.ok) throw new Error(`/metrics: HTTP ${resp.status}`);
      update(sample(parse(await resp.text()), performance.now()));
      view.dataset.polls = String(Number(view.dataset.polls) + 1);
      $("dash-status").textContent = "";
    } catch (e) {
      $("dash-status").textContent = "Last poll failed: " + e.message;
    } finally {
      inflight = false;
    }
  }

  function start() {
    if (timer) return;
    poll();
    timer = setInterval(poll, interval);
  }

  function stop() {
    clearInterval(timer);
    timer = null;
    prev = null; // a rate across a pause would average over it
  }

  function init() {
    const q = Number(new URLSearchParams(location.search).get("poll"));
    if (Number.isFinite(q) && q >= 100 && q <= 3600000) interval = Math.round(q); // setInterval takes < 2^31 ms
    $("poll-interval").textContent = String(interval);
    $("window-size").textContent = String(WINDOW);
    window.addEventListener("resize", draw);
  }

  return { init, start, stop, parse };
})();
