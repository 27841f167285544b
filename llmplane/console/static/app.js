// The llmplane console: Chat, Fleet and Resources pages over the gateway's own API.
// Plain DOM (text set with textContent, never parsed as HTML), same-origin JSON only.
"use strict";

const API = "/console/api";
const CHART_WINDOW = 300; // seconds
const PALETTE = ["#1f6feb", "#d29922", "#cf222e", "#8250df"];

// --- helpers ---------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
  return el;
}

function $(id) { return document.getElementById(id); }

// --- keys ------------------------------------------------------------------------------------
// Once a Tenant or an admin key exists, the console API wants the admin key and chat a tenant
// key. The page asks whoami (always 200) before using a key, so a missing or wrong key shows
// the key prompt instead of a 401 in the browser. Keys live in sessionStorage only (gone with
// the tab), are sent as `Authorization: Bearer`, and never written into the page.

const auth = {
  storage: { admin: "llmplane.key.admin", chat: "llmplane.key.chat" },
  ok: { admin: false, chat: false },
  adminKey: true, // whoami: is an admin key configured (else no key reads the console)
  pending: { admin: null, chat: null },
  waiters: [],

  key(kind) {
    const own = sessionStorage.getItem(this.storage[kind]) || "";
    return own || (kind === "chat" ? sessionStorage.getItem(this.storage.admin) || "" : "");
  },

  headers(kind) {
    const key = this.key(kind);
    return key ? { Authorization: `Bearer ${key}` } : {};
  },

  async allows(kind, key) {
    const resp = await fetch(`${API}/whoami`, {
      headers: { Accept: "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) },
      credentials: "same-origin",
    });
    if (!resp.ok) throw new Error(`cannot check the key: HTTP ${resp.status}`);
    const data = await resp.json();
    this.adminKey = data.adminKey !== false;
    return Boolean(data[kind]);
  },

  // Resolves once the key for `kind` is good: at once when it is, else after the user gives one.
  ensure(kind) {
    if (this.ok[kind]) return Promise.resolve();
    if (!this.pending[kind]) {
      this.pending[kind] = (async () => {
        if (!(await this.allows(kind, this.key(kind)))) await this.prompt(kind);
        this.ok[kind] = true;
      })().finally(() => { this.pending[kind] = null; });
    }
    return this.pending[kind];
  },

  forget(kind) { this.ok[kind] = false; },

  // Drop the open prompts for `kind`: one that no key can satisfy must not hold up chat's.
  dismiss(kind) {
    const first = this.waiters[0];
    this.waiters = this.waiters.filter((w) => w.kind !== kind);
    this.pending[kind] = null;
    if (first && first.kind === kind) this.open();
  },

  prompt(kind) {
    return new Promise((resolve) => {
      this.waiters.push({ kind, resolve });
      if (this.waiters.length === 1) this.open();
    });
  },

  open() {
    const next = this.waiters[0];
    if (!next) { $("key-panel").hidden = true; return; }
    $("key-kind").textContent = next.kind !== "admin"
      ? "Chat needs a tenant API key (llmplane keys create TENANT)."
      : this.adminKey
        ? "This console needs the admin key (llmplane keys admin) to read the fleet."
        : "This console needs the admin key, and none is configured: run llmplane keys admin " +
          "and start with the setting it prints (--gateway-config).";
    $("key-error").textContent = "";
    $("key-input").value = "";
    $("key-panel").hidden = false;
    $("key-input").focus();
  },

  async submit() {
    const next = this.waiters[0];
    const key = $("key-input").value.trim();
    $("key-input").value = "";
    $("key-error").textContent = "";
    if (!next || !key) return;
    let good = false;
    try {
      good = await this.allows(next.kind, key);
    } catch (err) {
      $("key-error").textContent = err.message;
      return;
    }
    if (!good) {
      $("key-error").textContent = next.kind !== "admin"
        ? "That key was refused: it is not a live API key of a tenant."
        : this.adminKey
          ? "That key was refused: it is not the admin key."
          : "That key was refused: no admin key is configured.";
      return;
    }
    sessionStorage.setItem(this.storage[next.kind], key);
    this.waiters.shift();
    next.resolve();
    this.open();
  },
};

async function getJSON(path) {
  await auth.ensure("admin");
  const resp = await fetch(path, { headers: { Accept: "application/json", ...auth.headers("admin") }, credentials: "same-origin" });
  if (resp.status === 401) auth.forget("admin"); // the key went stale: ask again next time
  let data = {};
  try { data = await resp.json(); } catch (e) { /* not JSON */ }
  if (!resp.ok) throw new Error((data.error && data.error.message) || `HTTP ${resp.status}`);
  return data;
}

function pct(v) { return v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`; }
function num(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits || 0); }

function bar(value) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "–");
  const fill = h("span", { class: "fill" });
  fill.style.width = `${Math.min(100, Math.max(0, value * 100)).toFixed(1)}%`;
  if (value > 0.8) fill.classList.add("hot");
  return h("span", { class: "bar", title: pct(value) }, fill, h("span", { class: "bar-label" }, pct(value)));
}

function phaseBadge(phase) {
  const cls = { Ready: "ok", Starting: "warn", Pending: "warn", NotReady: "bad", Failed: "bad", Terminating: "muted" }[phase] || "muted";
  return h("span", { class: `badge ${cls}` }, phase || "?");
}

// --- pages -----------------------------------------------------------------------------------

const pages = {};
let current = null;

function show(name) {
  if (!pages[name]) name = "chat";
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== `page-${name}`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === name);
  if (current && current !== pages[name] && current.leave) current.leave();
  current = pages[name];
  if (current.enter) current.enter();
}

window.addEventListener("hashchange", () => show(location.hash.slice(1)));

// --- chat ------------------------------------------------------------------------------------

const chat = {
  messages: [],
  controller: null,
  models: [],

  async loadModels() {
    try {
      this.models = await this.routable();
    } catch (err) {
      this.models = [];
    }
    const select = $("chat-model");
    const previous = select.value;
    select.replaceChildren(...this.models.map((m) => h("option", { value: m.name }, m.name)));
    if (this.models.some((m) => m.name === previous)) select.value = previous;
    this.describeModel();
  },

  // The console's list of routable names; when no admin key is configured and the console API
  // is closed (a Tenant exists), the chat key's own /v1/models instead.
  async routable() {
    if (!auth.ok.admin && !(await auth.allows("admin", auth.key("admin"))) && !auth.adminKey) {
      auth.dismiss("admin");
      await auth.ensure("chat");
      const resp = await fetch("/v1/models", {
        headers: { Accept: "application/json", ...auth.headers("chat") },
        credentials: "same-origin",
      });
      if (resp.status === 401) auth.forget("chat");
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const data = await resp.json();
      return data.data.map((m) => ({ name: m.id, via: "this key's models" }));
    }
    return (await getJSON(`${API}/models`)).models;
  },

  describeModel() {
    const m = this.models.find((x) => x.name === $("chat-model").value);
    $("chat-model-via").textContent = m ? `routed by: ${m.via}` : "no routable model yet";
  },

  enter() { this.loadModels(); },

  addMessage(role, text) {
    const log = $("chat-log");
    const empty = log.querySelector(".empty");
    if (empty) empty.remove();
    const body = h("div", { class: "body" }, text);
    const meta = h("div", { class: "meta" });
    const el = h("div", { class: `msg ${role}` }, h("div", { class: "role" }, role), body, meta);
    log.appendChild(el);
    log.scrollTop = log.scrollHeight;
    return { el, body, meta };
  },

  params() {
    const body = {};
    const temperature = parseFloat($("chat-temperature").value);
    const topP = parseFloat($("chat-top-p").value);
    const maxTokens = parseInt($("chat-max-tokens").value, 10);
    const seed = parseInt($("chat-seed").value, 10);
    if (!Number.isNaN(temperature)) body.temperature = temperature;
    if (!Number.isNaN(topP)) body.top_p = topP;
    if (!Number.isNaN(maxTokens)) body.max_tokens = maxTokens;
    if (!Number.isNaN(seed)) body.seed = seed;
    return body;
  },

  async send(text) {
    const model = $("chat-model").value;
    if (!model || !text.trim()) return;
    this.messages.push({ role: "user", content: text });
    this.addMessage("user", text);
    const out = this.addMessage("assistant", "");
    out.el.classList.add("streaming");
    const system = $("chat-system").value.trim();
    const messages = system ? [{ role: "system", content: system }, ...this.messages] : [...this.messages];
    const request = { model, messages, stream: true, stream_options: { include_usage: true }, ...this.params() };
    this.controller = new AbortController();
    $("chat-send").disabled = true;
    $("chat-stop").disabled = false;
    const t0 = performance.now();
    let tFirst = null;
    let chunks = 0;
    let usage = null;
    let text_ = "";
    let endpoint = "";
    let note = "";
    try {
      await auth.ensure("chat");
      const resp = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "text/event-stream", ...auth.headers("chat") },
        body: JSON.stringify(request),
        signal: this.controller.signal,
        credentials: "same-origin",
      });
      endpoint = resp.headers.get("x-llmplane-endpoint") || "";
      if (resp.status === 401) auth.forget("chat");
      if (!resp.ok) {
        let message = `HTTP ${resp.status}`;
        try { const data = await resp.json(); message = (data.error && data.error.message) || message; } catch (e) { /* not JSON */ }
        throw new Error(message);
      }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, cut).trim();
          buffer = buffer.slice(cut + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          let event;
          try { event = JSON.parse(data); } catch (e) { continue; }
          if (event.usage) usage = event.usage;
          const choice = event.choices && event.choices[0];
          const delta = choice && choice.delta && choice.delta.content;
          if (delta) {
            if (tFirst === null) tFirst = performance.now();
            chunks += 1;
            text_ += delta;
            out.body.textContent = text_;
            $("chat-log").scrollTop = $("chat-log").scrollHeight;
          }
        }
      }
    } catch (err) {
      if (err.name === "AbortError") note = "stopped";
      else {
        out.el.classList.add("error");
        out.body.textContent = text_ || "";
        out.body.appendChild(h("div", { class: "error-text" }, err.message));
      }
    } finally {
      const tEnd = performance.now();
      out.el.classList.remove("streaming");
      this.controller = null;
      $("chat-send").disabled = false;
      $("chat-stop").disabled = true;
      const tokens = usage && usage.completion_tokens ? usage.completion_tokens : chunks;
      const parts = [];
      if (endpoint) parts.push(h("span", { class: "endpoint", title: "the replica that served this answer" }, `served by ${endpoint}`));
      if (tFirst !== null) {
        parts.push(h("span", { class: "ttft" }, `TTFT ${Math.round(tFirst - t0)} ms`));
        const seconds = (tEnd - tFirst) / 1000;
        if (tokens > 1 && seconds > 0) parts.push(h("span", { class: "tps" }, `${((tokens - 1) / seconds).toFixed(1)} tokens/s`));
        parts.push(h("span", {}, `${tokens} tokens`));
      }
      if (note) parts.push(h("span", {}, note));
      out.meta.replaceChildren(...parts);
      if (text_) this.messages.push({ role: "assistant", content: text_ });
    }
  },
};

pages.chat = chat;

// --- fleet -----------------------------------------------------------------------------------

const fleet = {
  timer: null,
  openEvents: new Set(), // workloads whose events the user expanded (kept across redraws)
  renders: 0,
  points: [],
  log: null, // {workload, replica}
  logTimer: null,

  enter() {
    this.refresh();
    this.timer = setInterval(() => this.refresh(), 1000);
  },

  leave() {
    clearInterval(this.timer);
    this.timer = null;
    this.closeLog();
  },

  async refresh() {
    try {
      const since = this.points.length ? this.points[this.points.length - 1].t : null;
      const [data, stats] = await Promise.all([
        getJSON(`${API}/fleet`),
        getJSON(`${API}/stats${since !== null ? `?since=${since}` : ""}`),
      ]);
      this.points = this.points.concat(stats.points).slice(-CHART_WINDOW);
      this.render(data);
      this.charts();
      summary(data);
    } catch (err) {
      $("fleet-workloads").replaceChildren(h("div", { class: "error-text" }, `cannot read the fleet: ${err.message}`));
    }
  },

  charts() {
    const now = this.points.length ? this.points[this.points.length - 1].t : Date.now() / 1000;
    const series = (name, color, pick) => ({ name, color, points: this.points.map((p) => [p.t, pick(p)]) });
    drawChart($("chart-rps"), [
      series("ok", PALETTE[0], (p) => p.requests - p.errors),
      series("errors", PALETTE[2], (p) => p.errors),
    ], now, CHART_WINDOW);
    drawChart($("chart-ttft"), [
      series("p50", PALETTE[0], (p) => p.ttft[0]),
      series("p95", PALETTE[1], (p) => p.ttft[1]),
    ], now, CHART_WINDOW);
    drawChart($("chart-latency"), [
      series("p50", PALETTE[0], (p) => p.latency[0]),
      series("p95", PALETTE[1], (p) => p.latency[1]),
      series("p99", PALETTE[2], (p) => p.latency[2]),
    ], now, CHART_WINDOW);
    drawChart($("chart-tokens"), [series("tokens/s", PALETTE[3], (p) => p.outputTokens)], now, CHART_WINDOW);
  },

  render(data) {
    const loading = data.models.filter((m) => m.status !== "True");
    $("fleet-models").replaceChildren(...loading.map((m) =>
      h("div", { class: `model-note ${m.reason === "Loading" ? "warn" : "bad"}` }, `OpenModel ${m.name}: ${m.reason}${m.message ? ` — ${m.message}` : ""}`)));
    const cards = data.workloads.map((w) => this.card(w, data.embedded));
    if (!cards.length) cards.push(h("div", { class: "empty" }, "No Playgrounds or Services yet: llmplane apply -f playground.yaml"));
    $("fleet-workloads").replaceChildren(...cards);
    this.renders += 1;
    $("fleet-workloads").dataset.renders = String(this.renders);
    const other = data.otherEndpoints;
    $("fleet-other").replaceChildren(...(other.length ? [h("div", { class: "card" },
      h("div", { class: "card-head" }, h("h3", {}, "Other endpoints"), h("span", { class: "muted" }, "registered Endpoint objects and servers no workload owns")),
      this.table(other.map((e) => ({ index: "", phase: "Ready", endpoint: e, address: e.address, port: null, restarts: null })), null, false))] : []));
    $("fleet-migrations").replaceChildren(...(data.migrations && data.migrations.length ? [this.migrations(data.migrations)] : []));
  },

  // Streams that lost their replica and went on on another one (gateway/migration.py).
  migrations(routes) {
    const reasons = ["broken", "stalled", "engine_error", "drained"];
    const head = h("tr", {}, ...["Route", ...reasons, "Not continued", "Resume p50", "Resume p99"].map((t) => h("th", {}, t)));
    const ms = (v) => (v === null || v === undefined ? "–" : `${num(v, 1)} ms`);
    const rows = routes.map((r) => h("tr", { "data-route": r.route },
      h("td", {}, r.route),
      ...reasons.map((k) => h("td", {}, String(r.byReason[k] || 0))),
      h("td", {}, String(r.failed)),
      h("td", {}, ms(r.resumeMs && r.resumeMs[0])),
      h("td", {}, ms(r.resumeMs && r.resumeMs[1]))));
    return h("div", { class: "card", "data-testid": "migrations" },
      h("div", { class: "card-head" }, h("h3", {}, "Stream migrations"), h("span", { class: "muted" }, "streams whose replica was lost, continued on another one (this gateway process, since it started)")),
      h("table", { class: "replicas" }, h("thead", {}, head), h("tbody", {}, ...rows)));
  },

  card(w, embedded) {
    const ok = w.ready >= w.desired && w.desired > 0;
    const head = h("div", { class: "card-head" },
      h("h3", {}, w.role ? `${w.kind} ${w.namespace}/${w.playground}` : `${w.kind} ${w.namespace}/${w.name}`),
      w.role ? h("span", { class: "badge role", "data-testid": "role", title: "disaggregated role (its own workload)" }, w.role) : null,
      h("span", { class: `badge ${ok ? "ok" : "warn"} replicas`, "data-testid": "replicas", title: "ready / desired replicas" }, `${w.ready}/${w.desired} ready`),
      w.kvMoved === null || w.kvMoved === undefined ? null : h("span", { class: "badge muted", "data-testid": "kv-moved", title: "prompt tokens whose KV cache the decode replicas took from prefill over the KV connector (vllm:external_prefix_cache_hits_total), since each started" }, `KV from prefill: ${Math.round(w.kvMoved).toLocaleString("en-US")} tokens`),
      h("span", { class: "muted" }, `model ${w.models.join(", ") || "–"} · backend ${w.backend || "–"}`));
    // Available/Ready say whether it serves (green or red); others (Progressing) are context.
    const tone = (c) => (["Available", "Ready"].includes(c.type) ? (c.status === "True" ? "ok" : c.status === "False" ? "bad" : "muted") : "muted");
    const conditions = h("div", { class: "conditions" }, ...w.conditions.map((c) =>
      h("span", { class: `cond ${tone(c)}`, title: c.message || "" }, `${c.type}=${c.status}: ${c.reason || ""}${c.message && c.status !== "True" ? ` (${c.message})` : ""}`)));
    const key = `${w.namespace}/${w.name}`;
    const events = w.events.length ? h("details", { class: "events", open: this.openEvents.has(key), ontoggle: (ev) => (ev.target.open ? this.openEvents.add(key) : this.openEvents.delete(key)) }, h("summary", {}, `Events (${w.events.length})`),
      h("table", {}, h("tbody", {}, ...w.events.slice().reverse().map((e) => h("tr", { class: e.type === "Warning" ? "warning" : "" },
        h("td", {}, e.lastTimestamp.replace("T", " ").replace("Z", "")), h("td", {}, e.type), h("td", {}, e.reason),
        h("td", {}, e.count > 1 ? `${e.message} (x${e.count})` : e.message)))))) : null;
    return h("div", { class: "card", "data-workload": `${w.namespace}/${w.name}` }, head, conditions,
      this.table(w.replicas, `${w.namespace}/${w.name}`, embedded), events);
  },

  table(replicas, workload, embedded) {
    const head = h("tr", {}, ...["#", "State", "Restarts", "Port", "Engine", "Queue", "Waiting", "Running", "In flight", "KV cache", "Prefix hits", "Blocks indexed", ""].map((t) => h("th", {}, t)));
    const rows = replicas.map((r) => {
      const e = r.endpoint || {};
      const logButton = embedded && workload && r.hasLog
        ? h("button", { class: "link", type: "button", "data-log": `${workload}#${r.index}`, onclick: () => this.openLog(workload, r.index) }, "log")
        : null;
      return h("tr", {},
        h("td", {}, String(r.index)),
        h("td", { title: r.message || "" }, phaseBadge(r.phase), r.reason ? h("span", { class: "muted small" }, ` ${r.reason}`) : null),
        h("td", {}, r.restarts === null || r.restarts === undefined ? "–" : String(r.restarts)),
        h("td", {}, r.port ? String(r.port) : (r.address || "–")),
        h("td", {}, e.engine || "–"),
        h("td", {}, e.queue === undefined ? "–" : num(e.queue, 1)),
        h("td", {}, num(e.waiting)),
        h("td", {}, num(e.running)),
        h("td", {}, e.inflight === undefined ? "–" : String(e.inflight)),
        h("td", {}, bar(e.kv)),
        h("td", {}, pct(e.prefixHitRate)),
        h("td", { title: e.kvBlockSize ? `block size ${e.kvBlockSize} tokens` : "" },
          e.kvBlocks === null || e.kvBlocks === undefined ? "–" : String(e.kvBlocks)),
        h("td", {}, logButton));
    });
    if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: 13, class: "muted" }, "no replicas")));
    return h("table", { class: "replicas" }, h("thead", {}, head), h("tbody", {}, ...rows));
  },

  openLog(workload, replica) {
    this.log = { workload, replica };
    $("log-title").textContent = `${workload} replica ${replica}`;
    $("log-text").textContent = "";
    $("log-panel").hidden = false;
    this.loadLog();
    clearInterval(this.logTimer);
    this.logTimer = setInterval(() => this.loadLog(), 2000);
  },

  closeLog() {
    clearInterval(this.logTimer);
    this.logTimer = null;
    this.log = null;
    $("log-panel").hidden = true;
  },

  async loadLog() {
    if (!this.log) return;
    const { workload, replica } = this.log;
    try {
      const data = await getJSON(`${API}/logs?workload=${encodeURIComponent(workload)}&replica=${replica}`);
      if (!this.log || this.log.workload !== workload || this.log.replica !== replica) return;
      const pre = $("log-text");
      const text = data.text || data.note || "";
      if (pre.textContent === text) return;
      const top = pre.scrollTop;
      pre.textContent = text;
      pre.scrollTop = $("log-follow").checked ? pre.scrollHeight : top;
    } catch (err) {
      $("log-text").textContent = `cannot read the log: ${err.message}`;
    }
  },
};

pages.fleet = fleet;

function summary(data) {
  const desired = data.workloads.reduce((n, w) => n + w.desired, 0);
  const ready = data.workloads.reduce((n, w) => n + w.ready, 0);
  $("summary").textContent = `${data.workloads.length} workloads · ${ready}/${desired} replicas ready`;
}

// --- resources -------------------------------------------------------------------------------

const resourcesPage = {
  data: null,
  open: new Set(),

  async enter() {
    try {
      this.data = await getJSON(`${API}/resources`);
    } catch (err) {
      $("res-list").replaceChildren(h("div", { class: "error-text" }, err.message));
      return;
    }
    this.render();
  },

  render() {
    const filter = $("res-filter").value.trim().toLowerCase();
    const groups = [];
    for (const group of this.data.kinds) {
      const items = group.items.filter((it) => !filter || group.kind.toLowerCase().includes(filter) || it.name.toLowerCase().includes(filter));
      if (!items.length) continue;
      groups.push(h("div", { class: "card" },
        h("div", { class: "card-head" }, h("h3", {}, group.kind), h("span", { class: "muted" }, `${items.length}`)),
        ...items.map((it) => {
          const key = `${group.kind}/${it.namespace || ""}/${it.name}`;
          const details = h("details", { class: "resource", open: this.open.has(key) },
            h("summary", {}, it.namespace ? `${it.namespace}/${it.name}` : it.name),
            h("pre", { class: "yaml" }, it.yaml));
          details.addEventListener("toggle", () => (details.open ? this.open.add(key) : this.open.delete(key)));
          return details;
        })));
    }
    if (!groups.length) groups.push(h("div", { class: "empty" }, "No resources match."));
    $("res-list").replaceChildren(...groups);
  },
};

pages.resources = resourcesPage;

// --- wiring ----------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("chat-model").addEventListener("change", () => chat.describeModel());
  $("chat-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("chat-text").value;
    $("chat-text").value = "";
    chat.send(text);
  });
  $("chat-text").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("chat-stop").addEventListener("click", () => chat.controller && chat.controller.abort());
  $("chat-clear").addEventListener("click", () => {
    chat.messages = [];
    $("chat-log").replaceChildren();
  });
  $("log-close").addEventListener("click", () => fleet.closeLog());
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    auth.submit();
  });
  $("chat-key").addEventListener("click", () => {
    auth.forget("chat");
    auth.prompt("chat").then(() => { auth.ok.chat = true; });
  });
  $("res-filter").addEventListener("input", () => resourcesPage.data && resourcesPage.render());
  show(location.hash.slice(1) || "chat");
});
