// The kernelbox console (docs/console.md). Every figure comes from the documented API, called
// with the console's header so that the server reads the HttpOnly cookie as the bearer token;
// this script never sees a token. Data is written with textContent only, never as HTML: a
// session name or a label is the tenant's text.
"use strict";

const HEADER = { "x-kernelbox-console": "1" };
const POLL_MS = 5000;     // one refresh at a time, this long after the previous one ended
const CALL_MS = 10000;    // each call's deadline
const PAGE = 50;          // kernels per page
const RECENT = 20;        // sessions, audit records and refusals shown

// `detail`: the session whose events are shown ({tenant, session}), or null.
const state = { who: null, offset: 0, paused: false, timer: null, detail: null };

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

async function call(method, path) {
  const r = await fetch(path, {
    method, headers: HEADER, credentials: "same-origin", cache: "no-store",
    signal: AbortSignal.timeout(CALL_MS),
  });
  let body = null;
  const text = await r.text();
  if (text) { try { body = JSON.parse(text); } catch (_) { body = null; } }
  if (!r.ok) {
    const e = new Error((body && body.error && body.error.message) || r.statusText);
    e.status = r.status;
    e.code = body && body.error && body.error.code;
    throw e;
  }
  return body;
}

function notice(text) {
  const n = $("notice");
  n.textContent = text || "";
  n.hidden = !text;
}

function ago(seconds) {
  if (seconds < 60) return `${seconds.toFixed(0)} s`;
  if (seconds < 3600) return `${(seconds / 60).toFixed(0)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function fill(tbody, rows) {
  const frag = document.createDocumentFragment();
  for (const cells of rows) {
    const tr = document.createElement("tr");
    for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
    frag.appendChild(tr);
  }
  tbody.replaceChildren(frag);
}

function isAdmin() { return state.who && state.who.role === "admin"; }

function confirmThen(question, action) {
  if (!window.confirm(question)) return;
  action().then(() => refresh()).catch((e) => notice(`refused: ${e.message}`));
}

async function showNodes() {
  const section = $("nodes-section");
  if (!isAdmin() || !state.who.cluster) { section.hidden = true; return; }
  section.hidden = false;
  const list = await call("GET", "/v1/nodes");
  fill($("nodes").tBodies[0], list.nodes.map((n) => {
    const td = el("td");
    const b = el("button", n.draining ? "Undrain" : "Drain", n.draining ? "" : "danger");
    b.addEventListener("click", () => confirmThen(
      `${n.draining ? "Undrain" : "Drain"} node ${n.name}?`,
      () => call(n.draining ? "DELETE" : "POST", `/v1/nodes/${encodeURIComponent(n.name)}/drain`)));
    td.appendChild(b);
    return [n.name + (n.name === list.this ? " (this)" : ""), n.state, n.epoch,
      ago(n.lease_age_seconds), `${n.live_kernels} / ${n.capacity}`, n.draining ? "yes" : "no", td];
  }));
}

async function showTenants() {
  const section = $("tenants-section");
  if (!isAdmin()) { section.hidden = true; return; }
  section.hidden = false;
  const [o, usage] = await Promise.all([call("GET", "/v1/admin/tenants"),
    call("GET", `/v1/usage?group_by=day&from=${today()}`)]);
  const day = new Map(usage.rows.map((r) => [r.tenant, r]));
  $("host-cap").textContent = `(host cap ${o.max_kernels} kernels)`;
  fill($("tenants").tBodies[0], o.tenants.map((t) => {
    const u = day.get(t.name) || { kernel_seconds: 0, cpu_seconds: 0, cells: 0 };
    return [t.name, t.live_kernels, t.max_kernels ?? "—", t.reserved ?? "—", t.cells,
      u.kernel_seconds.toFixed(0), u.cpu_seconds.toFixed(1), u.cells];
  }));
  const select = $("f-tenant");
  const chosen = select.value;
  const options = [el("option", "every tenant")];
  options[0].value = "";
  for (const t of o.tenants) { const opt = el("option", t.name); opt.value = t.name; options.push(opt); }
  select.replaceChildren(...options);
  select.value = chosen;
}

// One page of kernels: the admin's from the server, a page at a time; a tenant's (at most its
// cap) filtered and cut here from /v1/kernels.
async function kernelPage() {
  const st = $("f-state").value, q = $("f-q").value.trim();
  if (isAdmin()) {
    const p = new URLSearchParams({ offset: String(state.offset), limit: String(PAGE) });
    const tenant = $("f-tenant").value;
    if (tenant) p.set("tenant", tenant);
    if (st) p.set("state", st);
    if (q) p.set("q", q);
    return call("GET", `/v1/admin/kernels?${p}`);
  }
  const all = (await call("GET", "/v1/kernels")).kernels.filter((k) =>
    (!st || k.state === st) &&
    (!q || k.id.includes(q) || k.owner.includes(q) ||
      Object.entries(k.labels || {}).some(([a, b]) => a.includes(q) || b.includes(q))));
  return { kernels: all.slice(state.offset, state.offset + PAGE), total: all.length,
    offset: state.offset, limit: PAGE };
}

async function showKernels() {
  $("kernels-section").hidden = false;
  const page = await kernelPage();
  if (page.total > 0 && page.offset >= page.total) {
    state.offset = Math.floor((page.total - 1) / PAGE) * PAGE;
    return showKernels();
  }
  $("kernel-count").textContent = `(${page.total})`;
  const first = page.total === 0 ? 0 : page.offset + 1;
  $("page").textContent = `${first}–${page.offset + page.kernels.length} of ${page.total}`;
  $("prev").disabled = page.offset === 0;
  $("next").disabled = page.offset + page.kernels.length >= page.total;
  fill($("kernels").tBodies[0], page.kernels.map((k) => {
    const labels = Object.entries(k.labels || {}).map(([a, b]) => `${a}=${b}`).join(" ");
    const row = [k.tenant, sessionLink(k.tenant, k.session, k.child ? `${k.session} › ${k.child}` : k.session), k.id,
      el("td", k.state, `state-${k.state}`), k.generation, k.execution_count, ago(k.idle_seconds),
      el("td", labels, "labels")];
    if (isAdmin()) {
      const td = el("td");
      const b = el("button", "End session", "danger");
      b.dataset.session = k.session;
      b.dataset.tenant = k.tenant;
      b.addEventListener("click", () => confirmThen(
        `End session ${k.session} of tenant ${k.tenant}? Its kernels and their state go.`,
        () => call("DELETE",
          `/v1/admin/tenants/${encodeURIComponent(k.tenant)}/sessions/${encodeURIComponent(k.session)}`)));
      td.appendChild(b);
      row.push(td);
    }
    return row;
  }));
}

// A session's name as a button showing its events (the kernel detail).
function sessionLink(tenant, session, text) {
  const td = el("td");
  const b = el("button", text, "link");
  b.dataset.tenant = tenant;
  b.dataset.session = session;
  b.addEventListener("click", () => { state.detail = { tenant, session }; showDetail().catch((e) => notice(e.message)); });
  td.appendChild(b);
  return td;
}

function when(at) { return at ? at.replace("T", " ").replace("Z", "") : "—"; }

// The chosen session's recent lifecycle events and why its kernel was last lost.
async function showDetail() {
  const section = $("detail-section");
  if (!state.detail) { section.hidden = true; return; }
  const { tenant, session } = state.detail;
  const path = isAdmin()
    ? `/v1/admin/tenants/${encodeURIComponent(tenant)}/sessions/${encodeURIComponent(session)}/events`
    : `/v1/sessions/${encodeURIComponent(session)}/events`;
  const s = await call("GET", path);
  section.hidden = false;
  section.dataset.tenant = s.tenant;
  section.dataset.session = s.session;
  $("detail-name").textContent = `${s.tenant} / ${s.session}`;
  $("detail-loss").textContent = s.lost ? `lost: ${s.lost}` : "";
  const rows = s.events.slice().reverse().map((e) => [when(e.at),
    el("td", e.event, `event-${e.event}`), e.reason ?? "—", e.generation, e.container ?? "—", e.child ?? "—"]);
  if (rows.length === 0) rows.push(["no events kept", "", "", "", "", ""]);
  fill($("detail").tBodies[0], rows);
}

// The sessions whose kernel events changed last (every tenant's for the admin).
async function showEvents() {
  $("events-section").hidden = false;
  const r = await call("GET", `/v1/events?limit=${RECENT}`);
  fill($("events").tBodies[0], r.sessions.map((s) => {
    const last = s.events[s.events.length - 1] || {};
    return [s.tenant, sessionLink(s.tenant, s.session, s.session),
      el("td", last.reason ? `${last.event} (${last.reason})` : last.event, `event-${last.event}`),
      when(last.at), el("td", s.lost ?? "—", s.lost ? "loss" : ""), s.ended ? "none" : "yes"];
  }));
}

function short(hash) { return hash ? `${hash.slice(0, 16)}…` : "—"; }

// The audit trail's tail: hashes always, the code only where the tenant records it.
async function showAudit() {
  const section = $("audit-section");
  section.hidden = false;
  let r;
  try {
    r = await call("GET", `/v1/audit?limit=${RECENT}`);
  } catch (e) {
    if (e.code !== "no_audit_file") throw e;
    $("audit-note").textContent = "(this server writes no audit trail file)";
    fill($("audit").tBodies[0], []);
    return;
  }
  $("audit-note").textContent = `(the last ${r.records.length} records, from the trail's file)`;
  fill($("audit").tBodies[0], r.records.slice().reverse().map((a) => {
    const hash = el("td", short(a.code_sha256), "hash");
    hash.title = a.code_sha256;
    const code = el("td", a.code === undefined || a.code === null ? "(not recorded)" : a.code, "code");
    return [when(a.time), a.tenant, a.child ? `${a.session} › ${a.child}` : a.session, a.kind,
      a.status, a.duration_seconds.toFixed(2), hash, code];
  }));
}

// The egress proxy's recent refusals.
async function showRefusals() {
  $("refusals-section").hidden = false;
  const r = await call("GET", `/v1/egress/refusals?limit=${RECENT}`);
  $("refusals-note").textContent = r.egress ? "(the latest first)" : "(egress is off on this server)";
  fill($("refusals").tBodies[0], r.refusals.map((x) => [when(x.at), x.tenant, x.session,
    `${x.host}:${x.port}`, el("td", x.reason, "loss")]));
}

// Midnight UTC today, in seconds: the ledger's "today".
function today() { return Math.floor(Date.now() / 86400000) * 86400; }

function mib(bytes) { return `${(bytes / 1048576).toFixed(0)} MiB`; }

async function showUsage() {
  const section = $("usage-section");
  if (isAdmin()) { section.hidden = true; return; }
  section.hidden = false;
  const report = await call("GET", `/v1/usage?group_by=session&from=${today()}`);
  fill($("usage").tBodies[0], report.rows.map((r) => [r.session, r.kernel_seconds.toFixed(0),
    r.cpu_seconds.toFixed(1), mib(r.peak_memory_bytes), r.cells, r.commands]));
}

// The last CHART_HOURS hours of cells run (and kernel-seconds, in each bar's title), one small SVG bar chart per tenant (the
// admin's: every tenant's; a tenant's: its own), from `GET /v1/usage?group_by=hour`. Built
// with DOM calls only (no library, no inline style, no HTML strings).
const CHART_HOURS = 24;
const SVG = "http://www.w3.org/2000/svg";
const CHART_W = 240, CHART_H = 48;

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

function chart(tenant, first, values, seconds) {
  const fig = el("figure", undefined, "chart");
  fig.dataset.tenant = tenant;
  const max = Math.max(...values, 0);
  const total = values.reduce((a, b) => a + b, 0);
  const kernelSeconds = seconds.reduce((a, b) => a + b, 0);
  fig.appendChild(el("figcaption",
    `${tenant}: ${total} cells, ${kernelSeconds.toFixed(0)} kernel-seconds`));
  const s = svg("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, width: CHART_W, height: CHART_H,
    role: "img" });
  const label = document.createElementNS(SVG, "title");
  label.textContent = `cells per hour of tenant ${tenant}, last ${CHART_HOURS} hours`;
  s.appendChild(label);
  const w = CHART_W / values.length;
  values.forEach((v, i) => {
    const h = max > 0 ? Math.max(1, (v / max) * (CHART_H - 2)) : 0;
    const bar = svg("rect", { x: (i * w + 0.5).toFixed(1), y: (CHART_H - h).toFixed(1),
      width: Math.max(1, w - 1).toFixed(1), height: h.toFixed(1), class: "bar" });
    bar.dataset.hour = String(first + i * 3600);
    bar.dataset.value = String(v);
    const t = document.createElementNS(SVG, "title");
    t.textContent = `${new Date((first + i * 3600) * 1000).toISOString().slice(0, 13)}:00Z: ` +
      `${v} cells, ${seconds[i].toFixed(0)} kernel-seconds`;
    bar.appendChild(t);
    s.appendChild(bar);
  });
  fig.appendChild(s);
  return fig;
}

async function showCharts() {
  $("charts-section").hidden = false;
  const now = Math.floor(Date.now() / 1000);
  const first = now - (now % 3600) - (CHART_HOURS - 1) * 3600;
  const report = await call("GET", `/v1/usage?group_by=hour&from=${first}`);
  const per = new Map();
  for (const r of report.rows) {
    const i = Math.floor((r.start - first) / 3600);
    if (i < 0 || i >= CHART_HOURS) continue;
    if (!per.has(r.tenant)) {
      per.set(r.tenant, { cells: new Array(CHART_HOURS).fill(0), seconds: new Array(CHART_HOURS).fill(0) });
    }
    per.get(r.tenant).cells[i] += r.cells;
    per.get(r.tenant).seconds[i] += r.kernel_seconds;
  }
  const figs = [...per.keys()].sort().map((t) => chart(t, first, per.get(t).cells, per.get(t).seconds));
  if (figs.length === 0) figs.push(el("p", "no usage in the last 24 hours", "muted"));
  $("charts").replaceChildren(...figs);
}

async function refresh() {
  if (!state.who) return;
  const parts = [showKernels(), showTenants(), showNodes(), showUsage(), showCharts(),
    showDetail(), showEvents(), showAudit(), showRefusals()];
  const results = await Promise.allSettled(parts);
  const failed = results.filter((r) => r.status === "rejected").map((r) => r.reason);
  if (failed.some((e) => e.status === 401)) { signedOut(); return; }
  notice(failed.length ? `some figures could not be read: ${failed.map((e) => e.message).join("; ")}` : "");
  $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  if (!document.body.dataset.rendered) document.body.dataset.rendered = String(performance.now());
}

function signedOut() {
  state.who = null;
  for (const e of document.querySelectorAll("main > section")) e.hidden = true;
  $("signin").hidden = false;
  $("who").textContent = "not signed in";
  document.body.dataset.rendered = document.body.dataset.rendered || String(performance.now());
}

async function tick() {
  state.timer = null;
  if (!state.paused && !document.hidden) {
    try { await refresh(); } catch (e) { notice(e.message); }
  }
  state.timer = setTimeout(tick, POLL_MS);
}

async function start() {
  try {
    state.who = await call("GET", "/v1/whoami");
  } catch (e) {
    if (e.status === 401) { signedOut(); return; }
    notice(e.message);
    return;
  }
  const admin = isAdmin();
  $("who").textContent = admin ? "admin: every tenant" : `tenant ${state.who.tenant} (read-only)`;
  document.body.dataset.role = state.who.role;
  for (const e of document.querySelectorAll(".admin-only")) {
    if (e.tagName !== "SECTION") e.hidden = !admin;
  }
  const restart = () => { state.offset = 0; refresh(); };
  $("f-state").addEventListener("change", restart);
  $("f-tenant").addEventListener("change", restart);
  let typing = null;
  $("f-q").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(restart, 300); });
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); restart(); });
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
  $("next").addEventListener("click", () => { state.offset += PAGE; refresh(); });
  $("detail-close").addEventListener("click", () => { state.detail = null; $("detail-section").hidden = true; });
  $("pause").addEventListener("click", () => {
    state.paused = !state.paused;
    $("pause").textContent = state.paused ? "Resume" : "Pause";
  });
  $("reload").addEventListener("click", () => confirmThen("Reload the configuration (the tenants)?",
    async () => {
      try {
        const r = await call("POST", "/v1/admin/reload");
        notice(`reloaded: added ${r.added.length}, removed ${r.removed.length}, changed ${r.changed.length}`);
      } catch (e) { notice(`reload refused: ${e.message}`); }
    }));
  await tick();
}

document.addEventListener("DOMContentLoaded", () => {
  $("logout").addEventListener("click", async () => {
    try { await call("POST", "/console/logout"); } catch (_) { /* signed out either way */ }
    signedOut();
  });
  start();
});
