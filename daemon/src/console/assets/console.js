// dltsub operator console: a single page that polls the instance's /console/api/ JSON once a
// second and performs operator moves through /api/v1 (answered with execution reports).
// Plain JavaScript, no dependencies, nothing loaded from elsewhere.
"use strict";

const POLL_MS = 1000;
const TOKEN_KEY = "dltsub.token";
const STATUSES = ["QUEUED", "SUBMITTING", "PENDING", "VALID", "IN_DOUBT", "COMMITTED", "INVALID", "CANCELLED"];

const state = {
  route: null,
  timer: null,
  generation: 0,
  services: { q: "", holder: "", only: "", offset: 0, limit: 50 },
  batches: { offset: 0, limit: 50 },
};

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token()) h["Authorization"] = "Bearer " + token();
  return h;
}

async function getJson(path) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error((body.error && body.error.message) || response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

// An operator move: POST to the native API; the execution report (or the error) is shown.
async function act(path, body) {
  const init = { method: "POST", headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body) init.body = JSON.stringify(body);
  let shown;
  try {
    const response = await fetch(path, init);
    const answer = await response.json().catch(() => ({}));
    if (answer.state) {
      shown = { kind: answer.state, text: `${answer.operation}: ${answer.state}` + (answer.reason ? ` — ${answer.reason}` : "") };
    } else {
      const message = (answer.error && answer.error.message) || response.statusText;
      shown = { kind: "error", text: `refused (${response.status}): ${message}` };
    }
  } catch (error) {
    shown = { kind: "error", text: "request failed: " + error.message };
  }
  const report = document.getElementById("report");
  if (report) {
    report.className = shown.kind;
    report.dataset.state = shown.kind;
    report.textContent = shown.text;
  }
  poll();
}

function setLive(text, error) {
  const live = document.getElementById("live");
  live.textContent = text;
  live.className = "live" + (error ? " error" : "");
}

function ms(value) {
  if (value == null) return "";
  if (Math.abs(value) < 1000) return `${value} ms`;
  return `${(value / 1000).toFixed(1)} s`;
}

// Where a claim stands in its windows: the bar spans the slow window from the last
// renewal, the mark is the fast expiry, the fill is the time elapsed since the renewal.
function claimBar(service, fastMs, slowMs) {
  if (!service.claimant) return `<span class="tag">unclaimed</span>`;
  const elapsed = Math.max(0, slowMs - service.slow_left_ms);
  const fill = Math.min(100, (100 * elapsed) / slowMs);
  const mark = (100 * fastMs) / slowMs;
  const label = service.fast_left_ms > 0
    ? `fast in ${ms(service.fast_left_ms)}`
    : service.slow_left_ms > 0 ? `slow in ${ms(service.slow_left_ms)}` : "expired";
  return `<span class="bar" title="${esc(service.phase)}: fast expiry in ${esc(ms(service.fast_left_ms))}, slow in ${esc(ms(service.slow_left_ms))}">` +
    `<span class="fill ${esc(service.phase)}" style="width:${fill.toFixed(1)}%"></span>` +
    `<span class="mark" style="left:${mark.toFixed(1)}%"></span></span>` +
    `<span class="barlabel">${esc(label)}</span>`;
}

function counts(service) {
  return STATUSES.filter((s) => service.counts[s])
    .map((s) => {
      const kind = s === "IN_DOUBT" || s === "INVALID" ? "bad" : s === "COMMITTED" ? "ok" : s === "QUEUED" ? "" : "warn";
      return `<span class="tag ${kind}" title="${s}">${s.toLowerCase()} ${service.counts[s]}</span>`;
    })
    .join("") || `<span class="muted">no batches</span>`;
}

function pinText(service) {
  const parts = [];
  if (service.pin_label) parts.push(`<span class="tag">pin ${esc(service.pin_label)}</span>`);
  if (service.exclude_label) parts.push(`<span class="tag">not ${esc(service.exclude_label)}</span>`);
  return parts.join("");
}

function serviceLink(id) {
  return `<a href="#/service/${encodeURIComponent(id)}">${esc(id)}</a>`;
}

// ---------------------------------------------------------------------- overview

function overviewSkeleton() {
  return `
  <section><h2>Cluster</h2><div id="totals" class="cards"></div></section>
  <section><h2>Instances</h2><div id="instances"></div></section>
  <section><h2>Throughput and commit latency, last 5 minutes</h2><div id="commits"></div></section>
  <section><h2>Services</h2>
    <form class="filters" id="service-filters">
      <input id="f-q" placeholder="service id contains" value="${esc(state.services.q)}">
      <input id="f-holder" placeholder="held by instance" value="${esc(state.services.holder)}">
      <select id="f-only">
        ${["", "backlog", "paused", "pinned", "unserved", "unclaimed"].map((o) =>
          `<option value="${o}" ${o === state.services.only ? "selected" : ""}>${o || "all"}</option>`).join("")}
      </select>
      <label>per page <select id="f-limit">${[25, 50, 100, 200].map((n) =>
        `<option ${n === state.services.limit ? "selected" : ""}>${n}</option>`).join("")}</select></label>
    </form>
    <div id="services"></div>
    <div class="pager"><button id="prev" type="button">‹ previous</button><span id="range"></span><button id="next" type="button">next ›</button></div>
  </section>`;
}

function bindOverview() {
  const form = document.getElementById("service-filters");
  const update = () => {
    state.services.q = document.getElementById("f-q").value.trim();
    state.services.holder = document.getElementById("f-holder").value.trim();
    state.services.only = document.getElementById("f-only").value;
    state.services.limit = Number(document.getElementById("f-limit").value);
    state.services.offset = 0;
    poll();
  };
  form.addEventListener("input", debounce(update, 250));
  form.addEventListener("submit", (event) => { event.preventDefault(); update(); });
  document.getElementById("prev").onclick = () => {
    state.services.offset = Math.max(0, state.services.offset - state.services.limit);
    poll();
  };
  document.getElementById("next").onclick = () => {
    state.services.offset += state.services.limit;
    poll();
  };
}

function debounce(fn, wait) {
  let timer;
  return () => { clearTimeout(timer); timer = setTimeout(fn, wait); };
}

function renderTotals(overview) {
  const t = overview.totals;
  const card = (label, value, bad) => `<div class="card ${bad ? "bad" : ""}"><b>${esc(value)}</b>${esc(label)}</div>`;
  const unfinished = Object.entries(t.unfinished).map(([s, n]) => card(s.toLowerCase(), n, s === "IN_DOUBT" && n > 0)).join("");
  const live = overview.instances.filter((i) => i.live).length;
  document.getElementById("totals").innerHTML =
    card("live instances", live, live === 0) + card("services", t.services) + card("paused", t.paused) +
    card("pinned", t.pinned) + `<div id="unserved" class="card ${t.unserved ? "bad" : ""}" data-unserved="${t.unserved}"><b>${t.unserved}</b>unserved (pinned, no live instance may hold)</div>` +
    card("unclaimed with backlog", t.unclaimed_with_backlog, t.unclaimed_with_backlog > 0) + unfinished;
}

function renderInstances(overview) {
  const rows = overview.instances.map((i) => `
    <tr class="${i.live ? "" : "stale"}" data-instance="${esc(i.instance_id)}">
      <td class="mono"><a href="#/" data-holder-filter="${esc(i.instance_id)}">${esc(i.instance_id)}</a></td>
      <td>${i.live ? `<span class="tag ok">${esc(i.state)}</span>` : `<span class="tag bad">${esc(i.state)}, silent</span>`}</td>
      <td class="num">${esc(ms(i.heartbeat_age_ms))}</td>
      <td class="num">${esc(i.capacity)}</td>
      <td class="num" data-claims>${esc(i.claims)}</td>
      <td>${i.labels.map((l) => `<span class="tag">${esc(l)}</span>`).join("") || `<span class="muted">none</span>`}</td>
      <td class="muted">${esc(i.version)}</td>
    </tr>`).join("");
  document.getElementById("instances").innerHTML = `<table><thead><tr><th>instance</th><th>state</th><th class="num">heartbeat age</th>
    <th class="num">capacity</th><th class="num">claims held</th><th>labels</th><th>version</th></tr></thead><tbody>${rows ||
    `<tr><td colspan="7" class="muted">no instance registered</td></tr>`}</tbody></table>`;
  document.querySelectorAll("[data-holder-filter]").forEach((a) => {
    a.onclick = (event) => {
      event.preventDefault();
      state.services.holder = a.dataset.holderFilter;
      state.services.offset = 0;
      document.getElementById("f-holder").value = state.services.holder;
      poll();
    };
  });
}

// Commits per second (bars) and mean / max commit latency (lines) per interval.
function renderCommits(overview) {
  const c = overview.commits;
  const end = Math.floor(overview.read_at_ms / c.bucket_ms) * c.bucket_ms;
  const start = end - (c.buckets - 1) * c.bucket_ms;
  const byStart = new Map(c.series.map((b) => [b.start_ms, b]));
  const buckets = [];
  for (let t = start; t <= end; t += c.bucket_ms) buckets.push(byStart.get(t) || { start_ms: t, committed: 0, per_second: 0, latency_mean_ms: 0, latency_max_ms: 0 });
  const W = 900, H = 140, left = 50, right = 50, top = 10, bottom = 20;
  const bw = (W - left - right) / buckets.length;
  const maxRate = Math.max(1, ...buckets.map((b) => b.per_second));
  const maxLatency = Math.max(1, ...buckets.map((b) => b.latency_max_ms));
  const y = (v, max) => top + (H - top - bottom) * (1 - v / max);
  const bars = buckets.map((b, i) => `<rect x="${left + i * bw + 1}" y="${y(b.per_second, maxRate)}" width="${bw - 2}" height="${H - bottom - y(b.per_second, maxRate)}" fill="#90caf9"><title>${b.committed} committed (${b.per_second.toFixed(1)}/s), latency mean ${b.latency_mean_ms.toFixed(1)} ms, max ${b.latency_max_ms.toFixed(1)} ms</title></rect>`).join("");
  const line = (key, color) => `<polyline fill="none" stroke="${color}" stroke-width="1.5" points="${buckets.map((b, i) => `${left + (i + .5) * bw},${y(b[key], maxLatency)}`).join(" ")}"/>`;
  const total = buckets.reduce((n, b) => n + b.committed, 0);
  const last = buckets[buckets.length - 1];
  document.getElementById("commits").innerHTML = `
    <div class="muted">${total} committed in 5 min · last 10 s: ${last.per_second.toFixed(1)}/s, latency mean ${last.latency_mean_ms.toFixed(1)} ms, max ${last.latency_max_ms.toFixed(1)} ms
      · <span style="color:#1565c0">■</span> commits/s <span style="color:#2e7d32">━</span> mean latency <span style="color:#c62828">━</span> max latency (acceptance to COMMITTED)</div>
    <svg class="chart" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none">
      ${bars}${line("latency_mean_ms", "#2e7d32")}${line("latency_max_ms", "#c62828")}
      <text x="2" y="${top + 8}">${maxRate.toFixed(1)}/s</text><text x="2" y="${H - bottom}">0</text>
      <text x="${W - right + 4}" y="${top + 8}">${maxLatency.toFixed(0)} ms</text>
      <text x="${left}" y="${H - 4}">-5 min</text><text x="${W - right - 20}" y="${H - 4}">now</text>
    </svg>`;
}

// A pinned (or excluding) service that no live instance may hold.
function unserved(service, instances) {
  if (!service.pin_label && !service.exclude_label) return false;
  return !instances.some((i) => i.live &&
    (!service.pin_label || i.labels.includes(service.pin_label)) &&
    !(service.exclude_label && i.labels.includes(service.exclude_label)));
}

function renderServices(page, overview) {
  const fast = overview.fast_expiry_ms, slow = overview.slow_expiry_ms;
  const rows = page.services.map((s) => `
    <tr data-service="${esc(s.service_id)}">
      <td>${serviceLink(s.service_id)}</td>
      <td>${counts(s)}</td>
      <td>${s.paused ? `<span class="tag warn" data-paused>paused</span>` : ""} ${pinText(s)}${unserved(s, overview.instances) ? `<span class="tag bad" data-unserved-service>unserved</span>` : ""}</td>
      <td class="mono" data-holder="${esc(s.claimant || "")}">${esc(s.claimant || "—")}</td>
      <td class="num">${esc(s.epoch)}</td>
      <td>${claimBar(s, fast, slow)}</td>
    </tr>`).join("");
  document.getElementById("services").innerHTML = `<table><thead><tr><th>service</th><th>batches</th><th>flags</th>
    <th>holder</th><th class="num">epoch</th><th>claim (fast | slow window)</th></tr></thead><tbody>${rows ||
    `<tr><td colspan="6" class="muted">no service matches</td></tr>`}</tbody></table>`;
  const from = page.total ? page.offset + 1 : 0;
  document.getElementById("range").textContent = `${from}–${page.offset + page.services.length} of ${page.total}`;
  document.getElementById("prev").disabled = page.offset === 0;
  document.getElementById("next").disabled = page.offset + page.services.length >= page.total;
}

async function pollOverview(generation) {
  const s = state.services;
  const query = new URLSearchParams({ offset: s.offset, limit: s.limit });
  if (s.q) query.set("q", s.q);
  if (s.holder) query.set("holder", s.holder);
  if (s.only) query.set("only", s.only);
  const [overview, page] = await Promise.all([getJson("/console/api/overview"), getJson("/console/api/services?" + query)]);
  if (generation !== state.generation) return null;
  renderTotals(overview);
  renderInstances(overview);
  renderCommits(overview);
  renderServices(page, overview);
  return overview.read_at;
}

// ----------------------------------------------------------------------- service

function serviceSkeleton(id) {
  return `
  <section><h2>Service <span class="mono" id="service-id">${esc(id)}</span></h2>
    <div id="service-head"></div>
    <h2>Actions</h2>
    <div class="actions">
      <button type="button" id="pause">Pause</button>
      <button type="button" id="resume">Resume</button>
      <label>max_in_flight <input id="mif" type="number" min="1" max="1000" size="5"></label><button type="button" id="set-mif">Set</button>
      <label>pin to label <input id="pin" size="10" placeholder="none"></label>
      <label>exclude label <input id="exclude" size="10" placeholder="none"></label><button type="button" id="set-pin">Set pin</button>
    </div>
    <div id="report" role="status"></div>
  </section>
  <section><h2>Batches in order</h2><div id="batches"></div>
    <div class="pager"><button id="prev" type="button">‹ previous</button><span id="range"></span><button id="next" type="button">next ›</button></div>
  </section>`;
}

function bindService(id) {
  const path = "/api/v1/services/" + encodeURIComponent(id);
  document.getElementById("pause").onclick = () => act(path + "/pause");
  document.getElementById("resume").onclick = () => act(path + "/resume");
  document.getElementById("set-mif").onclick = () =>
    act(path + "/max_in_flight", { max_in_flight: Number(document.getElementById("mif").value) });
  document.getElementById("set-pin").onclick = () => act(path + "/pin", {
    pin_label: document.getElementById("pin").value.trim() || null,
    exclude_label: document.getElementById("exclude").value.trim() || null,
  });
  document.getElementById("prev").onclick = () => {
    state.batches.offset = Math.max(0, state.batches.offset - state.batches.limit);
    poll();
  };
  document.getElementById("next").onclick = () => {
    state.batches.offset += state.batches.limit;
    poll();
  };
  document.getElementById("batches").addEventListener("click", (event) => {
    const button = event.target.closest("button[data-move]");
    if (!button) return;
    act(`/api/v1/batches/${button.dataset.batch}/${button.dataset.move}?service_id=${encodeURIComponent(id)}`);
  });
}

function ledgerMessage(batch) {
  if (batch.last_error) return `<span class="tag bad">error</span> ${esc(batch.last_error)}`;
  if (batch.dlt_message == null) return `<span class="muted">—</span>`;
  return `<code>${esc(JSON.stringify(batch.dlt_message))}</code>`;
}

function moves(batch) {
  const out = [];
  if (batch.status === "QUEUED") out.push(`<button type="button" data-move="cancel" data-batch="${esc(batch.batch_id)}">cancel</button>`);
  if (batch.status === "QUEUED" || batch.status === "IN_DOUBT") out.push(`<button type="button" data-move="requeue" data-batch="${esc(batch.batch_id)}">requeue</button>`);
  return out.join(" ");
}

let filledInputs = false;

async function pollService(generation, id) {
  const query = new URLSearchParams({ offset: state.batches.offset, limit: state.batches.limit });
  const data = await getJson(`/console/api/services/${encodeURIComponent(id)}?${query}`);
  if (generation !== state.generation) return null;
  const s = data.service;
  document.getElementById("service-head").innerHTML = `<table><tbody>
    <tr><th>state</th><td id="service-state">${s.paused ? `<span class="tag warn">paused</span>` : `<span class="tag ok">active</span>`}</td></tr>
    <tr><th>max_in_flight</th><td>${esc(s.max_in_flight)}</td></tr>
    <tr><th>pinning</th><td>${pinText(s) || `<span class="muted">any instance</span>`}</td></tr>
    <tr><th>holder</th><td class="mono" data-holder="${esc(s.claimant || "")}">${esc(s.claimant || "—")} (epoch ${esc(s.epoch)})</td></tr>
    <tr><th>claim</th><td>${claimBar(s, data.fast_expiry_ms, data.slow_expiry_ms)}</td></tr>
    <tr><th>batches</th><td>${counts(s)}</td></tr></tbody></table>`;
  if (!filledInputs) {
    document.getElementById("mif").value = s.max_in_flight;
    document.getElementById("pin").value = s.pin_label || "";
    document.getElementById("exclude").value = s.exclude_label || "";
    filledInputs = true;
  }
  const page = data.batches;
  const rows = page.items.map((b) => `
    <tr data-batch="${esc(b.batch_id)}">
      <td class="num"><a href="#/batch/${b.seq}">${b.seq}</a></td>
      <td class="mono" title="${esc(b.batch_id)}">${esc(b.batch_id.slice(0, 16))}…</td>
      <td><span class="tag">${esc(b.status)}</span></td>
      <td class="num">${esc(b.attempts)}</td>
      <td class="num">${esc(b.submit_epoch ?? "")}</td>
      <td class="msg">${ledgerMessage(b)}</td>
      <td class="muted">${esc(b.updated_at)}</td>
      <td>${moves(b)}</td>
    </tr>`).join("");
  document.getElementById("batches").innerHTML = `<table><thead><tr><th class="num">seq</th><th>batch id</th><th>status</th>
    <th class="num">attempts</th><th class="num">epoch</th><th>last ledger message</th><th>updated</th><th></th></tr></thead>
    <tbody>${rows || `<tr><td colspan="8" class="muted">no batches</td></tr>`}</tbody></table>`;
  const from = page.total ? page.offset + 1 : 0;
  document.getElementById("range").textContent = `${from}–${page.offset + page.items.length} of ${page.total}`;
  document.getElementById("prev").disabled = page.offset === 0;
  document.getElementById("next").disabled = page.offset + page.items.length >= page.total;
  return data.read_at;
}

// ------------------------------------------------------------------------- batch

function batchSkeleton() {
  return `<section><h2>Batch</h2><div id="batch-head"></div><div class="actions" id="batch-actions"></div><div id="report" role="status"></div></section>
  <section><h2>History</h2><div id="history"></div></section>`;
}

async function pollBatch(generation, seq) {
  const data = await getJson(`/console/api/batches/${encodeURIComponent(seq)}`);
  if (generation !== state.generation) return null;
  const b = data.batch;
  document.getElementById("batch-head").innerHTML = `<table><tbody>
    <tr><th>service</th><td>${serviceLink(b.service_id)}</td></tr>
    <tr><th>seq</th><td>${b.seq}</td></tr>
    <tr><th>batch id</th><td class="mono msg">${esc(b.batch_id)}</td></tr>
    <tr><th>status</th><td><span class="tag">${esc(b.status)}</span></td></tr>
    <tr><th>attempts</th><td>${esc(b.attempts)}</td></tr>
    <tr><th>submitted</th><td class="mono">${esc(b.submitted_by || "—")} (epoch ${esc(b.submit_epoch ?? "—")})</td></tr>
    <tr><th>last ledger message</th><td class="msg">${ledgerMessage(b)}</td></tr>
    <tr><th>accepted</th><td>${esc(b.created_at)}</td></tr><tr><th>updated</th><td>${esc(b.updated_at)}</td></tr></tbody></table>`;
  const actions = document.getElementById("batch-actions");
  const wanted = moves(b);
  if (actions.dataset.html !== wanted) {
    actions.innerHTML = wanted;
    actions.dataset.html = wanted;
    actions.querySelectorAll("button[data-move]").forEach((button) => {
      button.onclick = () => act(`/api/v1/batches/${b.batch_id}/${button.dataset.move}?service_id=${encodeURIComponent(b.service_id)}`);
    });
  }
  const rows = data.history.map((e) => `<tr><td>${esc(e.at)}</td><td>${esc(e.old_status || "—")} → <b>${esc(e.new_status)}</b></td>
    <td class="num">${esc(e.epoch ?? "")}</td><td class="mono">${esc(e.instance_id || "")}</td><td>${esc(e.detail || "")}</td></tr>`).join("");
  document.getElementById("history").innerHTML = `<table><thead><tr><th>at</th><th>transition</th><th class="num">epoch</th>
    <th>instance</th><th>detail</th></tr></thead><tbody>${rows}</tbody></table>`;
  return data.read_at;
}

// ----------------------------------------------------------------- routing, polling

function parseRoute() {
  const hash = location.hash.replace(/^#/, "") || "/";
  let m;
  if ((m = hash.match(/^\/service\/(.+)$/))) return { view: "service", id: decodeURIComponent(m[1]) };
  if ((m = hash.match(/^\/batch\/(\d+)$/))) return { view: "batch", seq: m[1] };
  return { view: "overview" };
}

function show() {
  state.route = parseRoute();
  state.generation += 1;
  filledInputs = false;
  const view = document.getElementById("view");
  if (state.route.view === "service") {
    state.batches.offset = 0;
    view.innerHTML = serviceSkeleton(state.route.id);
    bindService(state.route.id);
  } else if (state.route.view === "batch") {
    view.innerHTML = batchSkeleton();
  } else {
    view.innerHTML = overviewSkeleton();
    bindOverview();
  }
  poll();
}

// One poll at a time: a poll asked for while one runs (after an action, a filter change)
// runs right after it.
let polling = false;
let pollAgain = false;

async function poll() {
  if (polling) {
    pollAgain = true;
    return;
  }
  polling = true;
  clearTimeout(state.timer);
  const generation = state.generation;
  try {
    let readAt;
    if (state.route.view === "service") readAt = await pollService(generation, state.route.id);
    else if (state.route.view === "batch") readAt = await pollBatch(generation, state.route.seq);
    else readAt = await pollOverview(generation);
    if (readAt) setLive("live · database clock " + readAt.replace("T", " ").replace("Z", " UTC"));
  } catch (error) {
    if (error.status === 401) setLive("enter the API token to see the cluster", true);
    else setLive("not updated: " + error.message, true);
  } finally {
    polling = false;
  }
  if (pollAgain) {
    pollAgain = false;
    poll();
  } else {
    state.timer = setTimeout(poll, POLL_MS);
  }
}

document.getElementById("token").value = token();
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  poll();
});
window.addEventListener("hashchange", show);
show();
