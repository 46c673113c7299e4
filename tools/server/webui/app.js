// The page's frame: the two tabs (the address names the open one: / is the chat, /dashboard the
// dashboard), the settings kept across reloads (the sampling fields and system prompt in
// localStorage; the API key in sessionStorage, so it leaves with the tab), and the model's name from
// GET /v1/models (which needs the key when the server has one).
"use strict";

const OspreyApp = (() => {
  const $ = (id) => document.getElementById(id);
  const app = { model: null };
  const SAVED = ["system-prompt", "temperature", "top-p", "max-tokens", "seed"];

  function store(kind) {
    try { return kind === "session" ? window.sessionStorage : window.localStorage; } catch (_) { return null; }
  }

  function loadSettings() {
    const ls = store("local"), ss = store("session");
    for (const id of SAVED) {
      const v = ls && ls.getItem("osprey." + id);
      if (v !== null && v !== undefined) $(id).value = v;
    }
    const key = ss && ss.getItem("osprey.api-key");
    if (key) $("api-key").value = key;
    for (const id of SAVED) $(id).addEventListener("input", () => ls && ls.setItem("osprey." + id, $(id).value));
    $("api-key").addEventListener("change", () => {
      if (ss) ss.setItem("osprey.api-key", $("api-key").value);
      fetchModel();
    });
  }

  async function fetchModel() {
    const name = $("model-name");
    try {
      const resp = await fetch("/v1/models", { headers: OspreyChat.headers() });
      if (resp.status === 401) {
        name.textContent = "API key required: set it in Settings";
        $("settings").hidden = false;
        return;
      }
      const j = await resp.json();
      app.model = j.data && j.data[0] ? j.data[0].id : null;
      name.textContent = app.model || "(no model)";
      if (j.data && j.data[0] && j.data[0].max_model_len) name.title = `max_model_len ${j.data[0].max_model_len}`;
    } catch (e) {
      name.textContent = "server unreachable";
    }
  }

  function show(tab, push) {
    const dash = tab === "dashboard";
    $("view-chat").hidden = dash;
    $("view-dashboard").hidden = !dash;
    $("tab-chat").setAttribute("aria-selected", String(!dash));
    $("tab-dashboard").setAttribute("aria-selected", String(dash));
    $("toggle-settings").hidden = dash;
    if (dash) OspreyDashboard.start();
    else OspreyDashboard.stop();
    const path = dash ? "/dashboard" : "/";
    if (push && location.pathname !== path) history.pushState({ tab }, "", path + location.search);
    document.title = dash ? "osprey · dashboard" : "osprey";
  }

  function init() {
    OspreyChat.init();
    OspreyDashboard.init();
    loadSettings();
    $("settings-form").addEventListener("submit", (e) => e.preventDefault());
    $("settings").hidden = !(store("local") && store("local").getItem("osprey.settings-open") === "1");
    $("toggle-settings").addEventListener("click", () => {
      $("settings").hidden = !$("settings").hidden;
      const ls = store("local");
      if (ls) ls.setItem("osprey.settings-open", $("settings").hidden ? "0" : "1");
    });
    $("tab-chat").addEventListener("click", () => show("chat", true));
    $("tab-dashboard").addEventListener("click", () => show("dashboard", true));
    window.addEventListener("popstate", () => show(location.pathname === "/dashboard" ? "dashboard" : "chat", false));
    document.addEventListener("visibilitychange", () => {
      if (!$("view-dashboard").hidden) {
        if (document.hidden) OspreyDashboard.stop();
        else OspreyDashboard.start();
      }
    });
    show(location.pathname === "/dashboard" ? "dashboard" : "chat", false);
    fetchModel();
    $("prompt").focus();
  }

  document.addEventListener("DOMContentLoaded", init);
  return app;
})();
