// The unimq console: plain JavaScript over the JSON admin API (/v1/admin), no library, no CDN.
// Each page renders from one or two API calls and the active page refreshes every REFRESH_MS.
"use strict";

const API = "/v1/admin";
const REFRESH_MS = Number(new URLSearchParams(location.search).get("refresh") || 2000);
const PAGE_SIZE = 50;
const state = { page: "overview", topicsOffset: 0, groupsOffset: 0, clientsOffset: 0, group: null, topic: null,
                samples: [], timer: null };

// ------------------------------------------------------------------ helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function $(id) { return document.getElementById(id); }

async function api(path, options) {
  const r = await fetch(API + path, options);
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = { error: "BAD_RESPONSE", message: text }; }
  if (!r.ok) {
    const err = new Error((body && body.message) || r.statusText);
    err.code = body && body.error;
    throw err;
  }
  return body;
}

function post(path, payload) {
  return api(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(payload) });
}

function fmt(n) {
  if (n === null || n === undefined) return "-";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: 2 });
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}

function time(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", "") : "-"; }

function parseTime(s) {
  if (!s) return null;
  if (/^\d+$/.test(s)) return Number(s);
  const t = Date.parse(s);
  if (Number.isNaN(t)) throw new Error("not a time: " + s);
  return t;
}

function table(id, headers, rows, onClick) {
  const t = $(id);
  t.replaceChildren(el("tr", {}, headers.map(h => el("th", {}, h))));
  for (const r of rows) {
    const tr = el("tr", onClick ? { class: "link" } : {}, r.cells.map(c => c instanceof Node ? el("td", {}, c)
      : el("td", typeof c === "number" ? { class: "num" } : {}, typeof c === "number" ? fmt(c) : c)));
    if (r.id) tr.id = r.id;
    if (onClick) tr.addEventListener("click", () => onClick(r));
    t.append(tr);
  }
  if (!rows.length) t.append(el("tr", {}, el("td", { colspan: headers.length }, "none")));
}

function pager(id, total, offset, go) {
  const p = $(id);
  const last = Math.min(offset + PAGE_SIZE, total);
  p.replaceChildren(
    el("button", { type: "button", onclick: () => go(Math.max(0, offset - PAGE_SIZE)) }, "‹ prev"),
    el("span", {}, total ? `${offset + 1}–${last} of ${fmt(total)}` : "0"),
    el("button", { type: "button", onclick: () => { if (last < total) go(offset + PAGE_SIZE); } }, "next ›"));
}

function setStatus(text, bad) {
  const s = $("status");
  s.textContent = text;
  s.className = "status" + (bad ? " error" : "");
}

function result(id, text, bad) {
  const r = $(id);
  r.textContent = text;
  r.className = "result" + (bad ? " error" : "");
}

// ------------------------------------------------------------------ overview

const COLORS = { mqtt: "#2a7ae2", amqp: "#e67e22", http: "#27ae60", grpc: "#8e44ad" };

async function overview() {
  const o = await api("/overview");
  const cards = Object.entries(o.doors).map(([door, d]) => el("div", { class: "card", id: "door-" + door },
    el("div", { class: "door" }, door),
    el("div", { class: "big" }, el("span", { class: "in-rate" }, fmt(d.in_per_s)), " in/s"),
    el("div", { class: "small" }, fmt(d.out_per_s) + " out/s"),
    el("div", { class: "small" }, "in ", el("span", { class: "in-total" }, fmt(d.messages_in)),
      " · out ", el("span", { class: "out-total" }, fmt(d.messages_out))),
    el("div", { class: "small" }, el("span", { class: "connections" }, fmt(d.connections)), " connections")));
  $("doors").replaceChildren(...cards);
  const s = o.store;
  const dl = $("store");
  dl.replaceChildren(
    el("dt", {}, "commitlog"), el("dd", { id: "store-bytes" }, bytes(s.commitlog_bytes)),
    el("dt", {}, "disk free"), el("dd", {}, s.disk_total_bytes ? `${bytes(s.disk_free_bytes)} of ${bytes(s.disk_total_bytes)}` : "-"),
    el("dt", {}, "topics"), el("dd", {}, fmt(o.topics)),
    el("dt", {}, "consumer groups"), el("dd", {}, fmt(o.groups)),
    el("dt", {}, "total lag"), el("dd", {}, fmt(o.lag)));
  table("overview-brokers", ["broker", "address", "writable", "replicated", "live", "topics"],
    o.brokers.map(b => ({ cells: [b.name, b.address || "in process", b.writable ? "yes" : "no",
      b.replicated ? "yes" : "no", el("span", { class: b.live ? "ok" : "bad" }, b.live ? "up" : "down"), b.topics] })));
  $("overview-replication").replaceChildren(...o.replication.map(g => el("div", { class: "small" },
    `group ${g.group}: master ${g.master || "(none)"}, in sync ${g.in_sync.length} of ${g.members}, largest lag ${fmt(g.max_lag)} bytes`)));
  state.samples.push({ t: o.time_ms, doors: o.doors });
  if (state.samples.length > 90) state.samples.shift();
  chart();
}

function chart() {
  const svg = $("rate-chart");
  const W = 600, H = 180, n = state.samples.length;
  const doors = Object.keys(COLORS);
  let max = 1;
  for (const s of state.samples) for (const d of doors) if (s.doors[d]) max = Math.max(max, s.doors[d].in_per_s, s.doors[d].out_per_s);
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  for (let i = 1; i < 4; i++) {
    const y = H - (H * i) / 4;
    const line = document.createElementNS(ns, "line");
    for (const [k, v] of Object.entries({ x1: 0, x2: W, y1: y, y2: y, stroke: "#e3e8ef" })) line.setAttribute(k, v);
    svg.append(line);
  }
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 4); label.setAttribute("y", 12); label.setAttribute("font-size", 11); label.setAttribute("fill", "#69768a");
  label.textContent = fmt(max) + "/s";
  svg.append(label);
  for (const d of doors) {
    for (const [key, dash] of [["in_per_s", ""], ["out_per_s", "4 3"]]) {
      const pts = state.samples.map((s, i) => {
        const v = s.doors[d] ? s.doors[d][key] : 0;
        return `${(n < 2 ? W : (i * W) / (n - 1)).toFixed(1)},${(H - (v / max) * (H - 16)).toFixed(1)}`;
      });
      const pl = document.createElementNS(ns, "polyline");
      pl.setAttribute("points", pts.join(" "));
      pl.setAttribute("fill", "none");
      pl.setAttribute("stroke", COLORS[d]);
      pl.setAttribute("stroke-width", 2);
      if (dash) pl.setAttribute("stroke-dasharray", dash);
      svg.append(pl);
    }
  }
  $("chart-legend").replaceChildren(...doors.map(d => el("span", {}, el("i", { style: "background:" + COLORS[d] }), d)),
    el("span", {}, "solid: in, dashed: out"));
}

// ------------------------------------------------------------------ topics

async function topics() {
  const q = encodeURIComponent($("topics-filter").value);
  const sys = $("topics-system").checked;
  const r = await api(`/topics?q=${q}&offset=${state.topicsOffset}&limit=${PAGE_SIZE}&include_system=${sys}`);
  table("topics-table", ["topic", "type", "queues", "messages", "retention", "consumers"],
    r.items.map(t => ({ id: "topic-" + t.name, name: t.name, cells: [t.name, t.type, t.queues.length, t.messages,
      t.retention_hours + " h" + (t.tier_retention_hours ? ` (tier ${t.tier_retention_hours} h)` : ""),
      t.consumers.join(", ")] })),
    r => { state.topic = r.name; topicDetail(); });
  pager("topics-pager", r.total, state.topicsOffset, o => { state.topicsOffset = o; refresh(); });
  if (state.topic) await topicDetail();
}

async function topicDetail() {
  const t = await api("/topics/" + encodeURIComponent(state.topic));
  const d = $("topic-detail");
  d.classList.remove("hidden");
  const qt = el("table", {}, el("tr", {}, ["queue", "min offset", "max offset", "messages"].map(h => el("th", {}, h))),
    t.queues.map(q => el("tr", {}, [q.queue_id, q.min_offset, q.max_offset, q.messages].map(v => el("td", { class: "num" }, fmt(v))))));
  d.replaceChildren(el("h2", {}, `${t.name} · ${t.type}`), qt,
    el("div", {}, "attributes: ", JSON.stringify(t.attributes)), el("div", {}, "consumer groups: ", t.consumers.join(", ") || "none"));
}

// ------------------------------------------------------------------ groups

async function groups() {
  const q = encodeURIComponent($("groups-filter").value);
  const r = await api(`/groups?q=${q}&offset=${state.groupsOffset}&limit=${PAGE_SIZE}`);
  table("groups-table", ["group", "topics", "lag", "in flight", "retrying", "dead letters"],
    r.items.map(g => ({ id: "group-" + g.group, name: g.group, cells: [g.group, g.topics.join(", "), g.lag, g.inflight, g.retry, g.dlq] })),
    r => { state.group = r.name; groupDetail(true); });
  pager("groups-pager", r.total, state.groupsOffset, o => { state.groupsOffset = o; refresh(); });
  if (state.group) await groupDetail(false);
}

async function groupDetail(fresh) {
  let g;
  try { g = await api("/groups/" + encodeURIComponent(state.group)); } catch (e) { state.group = null; return; }
  $("group-detail").classList.remove("hidden");
  $("group-title").textContent = "Group " + g.group;
  table("group-queues", ["topic", "queue", "broker", "consumer offset", "max offset", "lag", "in flight"],
    g.queues.map(q => ({ cells: [q.topic, q.queue_id, q.broker, q.consumer_offset, q.max_offset, q.lag, q.inflight] })));
  $("dlq-count").textContent = fmt(g.dlq) + " waiting";
  const sel = $("reset-topic");
  if (fresh || !sel.options.length) sel.replaceChildren(...g.topics.map(t => el("option", { value: t }, t)));
}

async function doReset(ev) {
  ev.preventDefault();
  try {
    const body = { topic: $("reset-topic").value };
    const v = $("reset-value").value.trim();
    if ($("reset-mode").value === "offset") {
      if (!/^\d+$/.test(v)) throw new Error("an offset is a number");
      body.offset = Number(v);
    } else {
      body.timestamp_ms = parseTime(v);
      if (body.timestamp_ms === null) throw new Error("give a time");
    }
    const qv = $("reset-queue").value.trim();
    if (qv) body.queue_id = Number(qv);
    const r = await post(`/groups/${encodeURIComponent(state.group)}/reset`, body);
    result("group-result", `reset ${r.topic}: ` + r.queues.map(q => `queue ${q.queue_id} → ${q.offset}`).join(", "));
    await groupDetail(false);
  } catch (e) { result("group-result", "reset failed: " + e.message, true); }
}

async function doResend(ev) {
  ev.preventDefault();
  try {
    const body = { max: Number($("resend-max").value || 100) };
    if ($("resend-topic").value.trim()) body.topic = $("resend-topic").value.trim();
    const r = await post(`/groups/${encodeURIComponent(state.group)}/resend-dlq`, body);
    result("group-result", `resent ${r.resent} dead letters to ${r.topic}`);
    await groupDetail(false);
  } catch (e) { result("group-result", "resend failed: " + e.message, true); }
}

// ------------------------------------------------------------------ clients

function clientDetails(c) {
  if (c.door === "mqtt") return (c.subscriptions || []).map(s => `${s.filter} (QoS ${s.qos})`).join(", ");
  if (c.door === "amqp") return (c.channels || []).map(ch => `channel ${ch.number}: ` + (ch.consumers.map(k => "consumes " + k.queue).join(", ") || "no consumers") + `, ${ch.unacked} unacked`).join("; ");
  if (c.door === "grpc") return `${c.client_type} ${c.group || ""} ${(c.topics || []).join(", ")}`;
  if (c.door === "http") return `${c.topic} → ${c.sink} (${Object.entries(c.deliveries || {}).map(([k, v]) => k + " " + v).join(", ")})`;
  return "";
}

async function clients() {
  const door = $("clients-door").value;
  const q = encodeURIComponent($("clients-filter").value);
  const r = await api(`/clients?door=${door}&q=${q}&offset=${state.clientsOffset}&limit=${PAGE_SIZE}`);
  $("clients-connections").textContent = "connections: " + Object.entries(r.connections).map(([d, n]) => `${d} ${n}`).join(", ");
  table("clients-table", ["door", "client", "connected", "remote", "user", "details", ""],
    r.items.map(c => ({ id: `client-${c.door}-${c.client_id}`, cells: [c.door, c.client_id,
      el("span", { class: c.connected ? "ok" : "bad" }, c.connected ? "yes" : "no"), c.remote, c.user, clientDetails(c),
      c.connected && c.door !== "http" ? el("button", { class: "danger", type: "button", onclick: () => disconnect(c) }, "Disconnect") : ""] })));
  pager("clients-pager", r.total, state.clientsOffset, o => { state.clientsOffset = o; refresh(); });
}

async function disconnect(c) {
  try {
    await post(`/clients/${c.door}/${encodeURIComponent(c.client_id)}/disconnect`, {});
    setStatus(`disconnected ${c.door} ${c.client_id}`);
    await clients();
  } catch (e) { setStatus("disconnect failed: " + e.message, true); }
}

// ------------------------------------------------------------------ messages

function searchPlaceholders() {
  const by = $("search-by").value;
  $("search-value").placeholder = by === "id" ? "message id" : by === "key" ? "key" : "(not used)";
  $("search-value").disabled = by === "time";
  $("search-topic").disabled = by === "id";
}

function messageCard(m) {
  const views = { text: m.body_text === null ? "(not UTF-8 text)" : m.body_text,
                  json: m.body_json === null ? "(not JSON)" : JSON.stringify(m.body_json, null, 2),
                  hex: m.body_hex.replace(/(..)/g, "$1 ").trim() };
  const pre = el("pre", { class: "body" }, m.body_json !== null ? views.json : views.text);
  const tabs = el("div", { class: "tabs toolbar" });
  for (const k of ["text", "json", "hex"]) {
    const b = el("button", { type: "button", class: (m.body_json !== null ? k === "json" : k === "text") ? "on" : "" }, k);
    b.addEventListener("click", () => { pre.textContent = views[k]; for (const o of tabs.children) o.classList.remove("on"); b.classList.add("on"); });
    tabs.append(b);
  }
  const props = el("table", {}, el("tr", {}, el("th", {}, "property"), el("th", {}, "value")),
    Object.entries(m.properties).map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v))));
  return el("div", { class: "msg", "data-message-id": m.message_id },
    el("div", {}, el("strong", {}, m.topic), ` queue ${m.queue_id} offset ${m.queue_offset} · came in by `,
      el("strong", { class: "protocol" }, m.protocol), ` · stored ${time(m.store_timestamp)}`),
    el("div", { class: "mono" }, `id ${m.message_id} · tag ${m.tag || "-"} · keys ${m.keys.join(", ") || "-"} · ${m.body_size} bytes`),
    tabs, pre, props, traceBox(m.message_id));
}

// A message's trace (GET /v1/admin/messages/{id}/trace): its life across doors, in time order.
function traceEvent(e) {
  const skip = new Set(["id", "topic", "event", "door", "at", "client", "group", "broker", "address"]);
  const detail = Object.entries(e).filter(([k]) => !skip.has(k)).map(([k, v]) => `${k}=${v}`).join(" ");
  return el("li", { class: "trace-event", "data-event": e.event, "data-door": e.door },
    el("span", { class: "mono" }, time(e.at)), " ", el("span", { class: `event event-${e.event}` }, e.event),
    " over ", el("span", { class: "badge door" }, e.door),
    e.client ? ` by ${e.client}` : "", e.group ? ` · group ${e.group}` : "", e.broker ? ` · broker ${e.broker}` : "",
    detail ? el("span", { class: "mono" }, ` · ${detail}`) : "");
}

function traceBox(id) {
  const box = el("div", { class: "trace" });
  const load = async () => {
    try {
      const t = await api(`/messages/${encodeURIComponent(id)}/trace`);
      const head = el("div", { class: "toolbar" }, el("strong", {}, "trace"),
        t.events.length ? ` ${t.events.length} events · doors ${t.doors.join(" → ")}` : " not traced (turn on trace_enabled on its topic)",
        el("button", { type: "button", class: "trace-refresh", onclick: load }, "refresh"));
      box.replaceChildren(head, t.events.length ? el("ol", {}, t.events.map(traceEvent)) : "");
    } catch (e) {
      box.replaceChildren(el("div", { class: "result error" }, "trace: " + e.message));
    }
  };
  load();
  return box;
}

async function search(ev) {
  if (ev) ev.preventDefault();
  const by = $("search-by").value;
  const p = new URLSearchParams();
  try {
    if (by === "id") p.set("id", $("search-value").value.trim());
    else {
      p.set("topic", $("search-topic").value.trim());
      if (by === "key") p.set("key", $("search-value").value.trim());
      const b = parseTime($("search-begin").value.trim()), e = parseTime($("search-end").value.trim());
      if (b !== null) p.set("begin_ms", b);
      if (e !== null) p.set("end_ms", e);
    }
    const r = await api("/messages?" + p.toString());
    result("search-info", `${r.items.length} found`);
    $("search-results").replaceChildren(...r.items.map(messageCard));
  } catch (e) {
    result("search-info", "search failed: " + e.message, true);
    $("search-results").replaceChildren();
  }
}

// ------------------------------------------------------------------ cluster

async function cluster() {
  const c = await api("/cluster");
  $("cluster-nameservers").replaceChildren(...(c.nameservers.length ? c.nameservers : ["embedded (this process)"]).map(n => el("li", {}, n)));
  table("cluster-brokers", ["broker", "address", "writable", "replicated", "live", "topics"],
    c.brokers.map(b => ({ cells: [b.name, b.address || "in process", b.writable ? "yes" : "no", b.replicated ? "yes" : "no",
      el("span", { class: b.live ? "ok" : "bad" }, b.live ? "up" : "down"), b.topics] })));
  const g = $("cluster-groups");
  if (c.controller_error) g.replaceChildren(el("div", { class: "bad" }, c.controller_error));
  else if (!c.groups.length) g.replaceChildren("no replicated groups known (set http_admin_controller to ask the controller)");
  else g.replaceChildren(...c.groups.map(grp => el("div", {}, el("h2", {}, `${grp.group}: master ${grp.master || "(none)"} epoch ${grp.epoch}`),
    el("table", {}, el("tr", {}, ["member", "address", "role", "offset", "lag"].map(h => el("th", {}, h))),
      grp.members.map(m => el("tr", {}, [m.id, m.address, m.role, fmt(m.offset), fmt(m.lag)].map(v => el("td", {}, v))))))));
  table("cluster-listening", ["listener", "address"], Object.entries(c.listening).map(([k, v]) => ({ cells: [k, v] })));
}

// ------------------------------------------------------------------ routing and refresh

const PAGES = { overview, topics, groups, clients, messages: null, cluster };

async function refresh() {
  const fn = PAGES[state.page];
  if (!fn) return;
  try {
    await fn();
    setStatus("live · " + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus("error: " + e.message, true);
  }
}

function show() {
  const page = (location.hash || "#overview").slice(1);
  state.page = page in PAGES ? page : "overview";
  for (const s of document.querySelectorAll(".page")) s.classList.toggle("active", s.id === "page-" + state.page);
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === state.page);
  document.body.dataset.page = state.page;
  refresh();
}

function debounce(fn, ms) { let t; return () => { clearTimeout(t); t = setTimeout(fn, ms); }; }

window.addEventListener("hashchange", show);
window.addEventListener("DOMContentLoaded", () => {
  $("topics-filter").addEventListener("input", debounce(() => { state.topicsOffset = 0; refresh(); }, 250));
  $("topics-system").addEventListener("change", () => { state.topicsOffset = 0; refresh(); });
  $("groups-filter").addEventListener("input", debounce(() => { state.groupsOffset = 0; refresh(); }, 250));
  $("clients-filter").addEventListener("input", debounce(() => { state.clientsOffset = 0; refresh(); }, 250));
  $("clients-door").addEventListener("change", () => { state.clientsOffset = 0; refresh(); });
  $("reset-form").addEventListener("submit", doReset);
  $("resend-form").addEventListener("submit", doResend);
  $("search-form").addEventListener("submit", search);
  $("search-by").addEventListener("change", searchPlaceholders);
  searchPlaceholders();
  show();
  state.timer = setInterval(refresh, REFRESH_MS);
});
