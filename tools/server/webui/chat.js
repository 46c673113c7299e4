// The chat: a conversation sent to POST /v1/chat/completions with stream: true, the reply read from
// the server-sent events as they come and rendered as markdown (markdown.js). Stop aborts the fetch:
// the server sees the connection close and aborts the request (its running count drops), and the
// partial reply stays in the conversation. Sampling fields left empty are not sent, so the server's
// defaults apply; the API key, if typed, goes in the Authorization header.
"use strict";

const OspreyChat = (() => {
  const $ = (id) => document.getElementById(id);
  let history = [];        // [{role, content}] of the conversation so far (no system message)
  let controller = null;   // the AbortController of the request in flight, or null

  function setState(state, text) {
    document.body.dataset.state = state;
    $("status").textContent = text || state;
    $("send").disabled = state === "generating";
    $("stop").disabled = state !== "generating";
  }

  // The request's sampling fields from the settings form; throws Error(reason) on a bad value.
  function samplingFields() {
    const out = {};
    // loOpen: the lower bound itself is refused (the server takes top_p in (0, 1])
    const num = (id, name, lo, hi, integer, loOpen = false) => {
      const raw = $(id).value.trim();
      if (raw === "") return;
      const v = Number(raw);
      if (!Number.isFinite(v) || v < lo || (loOpen && v === lo) || v > hi || (integer && !Number.isInteger(v)))
        throw new Error(`${name} must be ${integer ? "an integer" : "a number"} in ${loOpen ? "(" : "["}${lo}, ${hi}]`);
      out[name] = v;
    };
    num("temperature", "temperature", 0, 2, false);
    num("top-p", "top_p", 0, 1, false, true);
    num("max-tokens", "max_tokens", 1, 1 << 30, true);
    num("seed", "seed", Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, true);
    return out;
  }

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("api-key").value.trim();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  function bubble(role, text) {
    const m = document.createElement("div");
    m.className = "msg " + role;
    const r = document.createElement("span");
    r.className = "role";
    r.textContent = role;
    m.appendChild(r);
    const c = document.createElement("div");
    c.className = "content";
    if (role === "user") c.textContent = text;
    m.appendChild(c);
    $("messages").appendChild(m);
    scroll();
    return m;
  }

  function scroll() {
    const box = $("messages");
    box.scrollTop = box.scrollHeight;
  }

  // Reads a fetch Response's server-sent events; calls onData(json) for each "data:" payload but
  // "[DONE]". Resolves at the end of the stream.
  async function readEvents(resp, onData) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    const take = (event) => {
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data && data !== "[DONE]") onData(JSON.parse(data));
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        take(buf.slice(0, i));
        buf = buf.slice(i + 2);
      }
    }
    if (buf.trim()) take(buf);
  }

  async function send(text) {
    if (controller) return;
    const err = $("settings-error");
    let fields;
    try {
      fields = samplingFields();
      err.hidden = true;
    } catch (e) {
      err.textContent = e.message;
      err.hidden = false;
      $("settings").hidden = false;
      return;
    }
    history.push({ role: "user", content: text });
    bubble("user", text);
    const m = bubble("assistant", "");
    const content = m.querySelector(".content");
    content.classList.add("cursor");
    const meta = document.createElement("div");
    meta.className = "meta";
    m.appendChild(meta);

    const system = $("system-prompt").value.trim();
    const body = Object.assign({
      messages: (system ? [{ role: "system", content: system }] : []).concat(history),
      stream: true,
      stream_options: { include_usage: true },
    }, fields);
    if (OspreyApp.model) body.model = OspreyApp.model;

    let reply = "", reasoning = "", finish = null, usage = null, failure = null, pending = false;
    const t0 = performance.now();
    let tFirst = null;
    const draw = () => {
      pending = false;
      try {
        content.replaceChildren(OspreyMarkdown.render(reply));
      } catch (_) { // a reply the renderer cannot take is shown as text; the page must get back to idle
        content.textContent = reply;
      }
      if (reasoning) {
        let d = m.querySelector("details.reasoning");
        if (!d) {
          d = document.createElement("details");
          d.className = "reasoning";
          d.appendChild(document.createElement("summary")).textContent = "reasoning";
          d.appendChild(document.createElement("div"));
          m.insertBefore(d, content);
        }
        d.lastChild.textContent = reasoning;
      }
      scroll();
    };
    controller = new AbortController();
    setState("generating", "generating…");
    try {
      const resp = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!resp.ok) {
        let msg = `HTTP ${resp.status}`;
        try { msg += ": " + ((await resp.json()).error || {}).message; } catch (_) { /* not JSON */ }
        if (resp.status === 401) msg += " (set the API key in Settings)";
        throw new Error(msg);
      }
      await readEvents(resp, (ev) => {
        if (ev.error) throw new Error(ev.error.message || JSON.stringify(ev.error));
        if (ev.usage) usage = ev.usage;
        for (const ch of ev.choices || []) {
          const d = ch.delta || {};
          if (d.content) reply += d.content;
          if (d.reasoning_content) reasoning += d.reasoning_content;
          if (ch.finish_reason) finish = ch.finish_reason;
          if ((d.content || d.reasoning_content) && tFirst === null) tFirst = performance.now();
        }
        if (!pending) { pending = true; setTimeout(draw, 30); }
      });
    } catch (e) {
      if (e.name !== "AbortError") {
        failure = e.message;
        controller.abort(); // a bad event mid-stream: close the connection, so the server stops too
      } else finish = "stopped";
    }
    controller = null;
    draw();
    content.classList.remove("cursor");
    const bits = [];
    if (finish) bits.push(finish === "stopped" ? "stopped" : "finish: " + finish);
    if (usage) bits.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} tokens`);
    if (tFirst !== null) {
      const ms = performance.now() - tFirst;
      bits.push(`first token ${(tFirst - t0).toFixed(0)} ms`);
      if (usage && usage.completion_tokens > 1 && ms > 0) bits.push(`${((usage.completion_tokens - 1) / (ms / 1000)).toFixed(1)} tok/s`);
    }
    if (failure) {
      m.classList.add("error");
      const p = document.createElement("p");
      p.textContent = failure;
      content.appendChild(p);
      history.pop(); // the user's turn got no reply: not part of the conversation
    } else if (reply || reasoning) {
      history.push({ role: "assistant", content: reply });
    } else {
      history.pop();
    }
    meta.textContent = bits.join(" · ");
    m.dataset.done = failure ? "error" : finish || "end";
    setState("idle", finish === "stopped" ? "idle (stopped)" : failure ? "idle (error)" : "idle");
  }

  function stop() {
    if (controller) controller.abort();
  }

  function reset() {
    stop();
    history = [];
    $("messages").replaceChildren();
  }

  function init() {
    setState("idle");
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("prompt").value.trim();
      if (!text || controller) return;
      $("prompt").value = "";
      send(text);
    });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", stop);
    $("new-chat").addEventListener("click", reset);
  }

  return { init, headers };
})();
