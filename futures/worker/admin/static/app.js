// The worker's admin page: plain JS over the admin API (/api/openapi.json), no build step.
// Everything user-supplied (ids, topics, reasons) goes into the page as text, never as HTML.
// Timers themselves (list, one timer, firings) are read with the token typed in; counts and
// clocks need none. A payload is fetched only when "Show payload" is clicked.
"use strict";

const TOKEN_KEY = "kafka-timers-admin-token";
const PAGE_SIZE = 15;
const state = { window: "hour", after: null, nextCursor: null, shown: null, pending: 0, reads: "token" };

const $ = (id) => document.getElementById(id);

async function api(path, options = {}) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.error || `${response.status} ${response.statusText}`);
    error.status = response.status;
    error.body = body;
    throw error;
  }
  return body;
}

// A read of timers themselves: with the typed token, if any.
function read(path) {
  return api(path, { headers: token() ? { Authorization: `Bearer ${token()}` } : {} });
}

// Whether timers can be asked for now; otherwise why not, for the tables' empty rows.
function whyNoTimers() {
  if (state.reads === "disabled") return "timer reads are disabled on this worker: set TIMERS_ADMIN_READ_TOKEN or TIMERS_ADMIN_TOKEN";
  if (state.reads === "token" && !token()) return "type the admin token (or a read token) above to see timers";
  return null;
}

function timerPath(id, action = "") {
  return `/api/timers/${encodeURIComponent(id)}${action}`;
}

// -- formatting ------------------------------------------------------------------

function clock(ms) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  const time = d.toLocaleTimeString([], { hour12: false });
  return today ? time : `${d.toLocaleDateString()} ${time}`;
}

function relative(ms) {
  if (ms === null || ms === undefined) return "";
  const s = Math.round((ms - Date.now()) / 1000);
  const a = Math.abs(s);
  const text = a < 60 ? `${a}s` : a < 3600 ? `${Math.floor(a / 60)}m ${a % 60}s` :
    a < 86400 ? `${Math.floor(a / 3600)}h ${Math.floor((a % 3600) / 60)}m` : `${Math.floor(a / 86400)}d`;
  return s >= 0 ? `in ${text}` : `${text} ago`;
}

function seconds(value) {
  return value === null || value === undefined ? "–" : `${value.toFixed(value < 10 ? 2 : 0)}s`;
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (className) td.className = className;
  return td;
}

function fillTable(id, rows, makeRow, emptyText) {
  const body = $(id).querySelector("tbody");
  const fresh = rows.map(makeRow);
  if (!fresh.length) {
    const tr = document.createElement("tr");
    const td = cell(emptyText, "muted");
    td.colSpan = $(id).querySelectorAll("th").length;
    tr.append(td);
    fresh.push(tr);
  }
  body.replaceChildren(...fresh);
}

function say(text, isError = false) {
  const box = $("message");
  box.textContent = text;
  box.className = isError ? "error" : "";
  box.hidden = false;
}

function token() {
  return $("token").value.trim();
}

// -- status ------------------------------------------------------------------------

async function refreshStats() {
  const stats = await api("/api/stats");
  state.pending = stats.pending;
  state.reads = stats.timer_reads;
  $("worker").textContent = stats.worker + (stats.ready ? "" : " · recovering");
  $("mutations").textContent = stats.mutations_enabled ? "" : "cancel disabled: TIMERS_ADMIN_TOKEN not set";
  $("s-pending").textContent = stats.pending.toLocaleString();
  $("s-next").textContent = stats.next_due_ms ? `${clock(stats.next_due_ms)} (${relative(stats.next_due_ms)})` : "none";
  $("s-fired").textContent = stats.fired_last_minute.toLocaleString();
  $("s-lateness").textContent = `${seconds(stats.lateness.p50_s)} / ${seconds(stats.lateness.p99_s)}`;
  const reasons = Object.entries(stats.dead_letters);
  $("s-dlq").textContent = reasons.reduce((sum, [, d]) => sum + d.count, 0).toLocaleString();

  fillTable("partitions", stats.partitions, (p) => {
    const tr = document.createElement("tr");
    if (p.stalled) {
      tr.className = "bad";
      tr.title = p.stall_reason;
    }
    tr.dataset.partition = p.partition;
    tr.append(
      cell(p.partition),
      cell(p.pending.toLocaleString()),
      cell(p.watermark_s === null ? "no tick yet" : clock(p.watermark_s * 1000)),
      cell(seconds(p.clock_lag_s)),
      cell(p.last_tick_age_s === null ? "never" : `${seconds(p.last_tick_age_s)} ago`),
      cell(p.last_tick_source),
    );
    return tr;
  }, "no partitions assigned to this worker");

  const elsewhere = Object.entries(stats.elsewhere);
  $("elsewhere").textContent = elsewhere.length ?
    "Held by other workers: " + elsewhere.map(([url, parts]) => `partitions ${parts.join(", ")} at ${url}`).join("; ") :
    "";

  fillTable("oscillators", stats.oscillators, (o) => {
    const tr = document.createElement("tr");
    if (o.stale) tr.className = "bad";
    tr.append(cell(o.source), cell(o.last_second), cell(`${seconds(o.age_s)} ago`), cell(o.ticks.toLocaleString()));
    return tr;
  }, "no ticks seen since this worker started");

  fillTable("dead-letters", reasons, ([reason, d]) => {
    const tr = document.createElement("tr");
    tr.append(cell(reason), cell(d.count.toLocaleString()), cell(`${clock(d.last_ms)} (${relative(d.last_ms)})`));
    return tr;
  }, "none since this worker started");
}

// Timers refused (no token, a wrong one): the reason goes into the table, not into an error box.
async function timersOr(id, load) {
  const why = whyNoTimers();
  if (why) {
    fillTable(id, [], () => null, why);
    return null;
  }
  try {
    return await load();
  } catch (error) {
    if (error.status !== 401 && error.status !== 403) throw error;
    fillTable(id, [], () => null, error.message);
    return null;
  }
}

async function refreshFirings() {
  const page = await timersOr("firings", () => read(`/api/firings?limit=${PAGE_SIZE}`));
  if (!page) return;
  const { firings } = page;
  fillTable("firings", firings, (f) => {
    const tr = document.createElement("tr");
    tr.append(
      cell(f.id, "id"),
      cell(f.partition),
      cell(clock(f.due_ms)),
      cell(clock(f.fired_ms)),
      cell(seconds(f.lateness_s), f.lateness_s > 2 ? "late" : "ok"),
    );
    return tr;
  }, "nothing fired since this worker started");
}

async function refreshTimeline() {
  const t = await api(`/api/timeline?window=${state.window}`);
  const max = Math.max(1, ...t.buckets);
  const bars = t.buckets.map((count, i) => {
    const bar = document.createElement("div");
    bar.className = count ? "bar" : "bar empty";
    bar.style.height = `${(100 * count) / max}%`;
    const from = t.start_ms + i * t.bucket_s * 1000;
    bar.title = `${clock(from)}: ${count.toLocaleString()} timer(s)`;
    return bar;
  });
  $("timeline").replaceChildren(...bars);
  $("t-start").textContent = clock(t.start_ms);
  $("t-end").textContent = clock(t.start_ms + t.buckets.length * t.bucket_s * 1000);
  const notes = [`max ${max.toLocaleString()} per ${t.bucket_s / 60} min`];
  if (t.overdue) notes.push(`${t.overdue.toLocaleString()} overdue`);
  if (t.truncated) notes.push("counted up to the scan limit");
  $("t-note").textContent = notes.join(" · ");
}

// -- pending timers ----------------------------------------------------------------

async function loadTimers(after) {
  const query = new URLSearchParams({ limit: PAGE_SIZE });
  if (after) query.set("after", after);
  const page = await timersOr("timers", () => read(`/api/timers?${query}`));
  if (!page) {
    $("next-page").disabled = true;
    return;
  }
  state.after = after;
  state.nextCursor = page.next;
  $("next-page").disabled = !page.next;
  fillTable("timers", page.timers, (t) => {
    const tr = document.createElement("tr");
    tr.className = "clickable";
    tr.dataset.id = t.id;
    tr.append(
      cell(`${clock(t.due_ms)} (${relative(t.due_ms)})`),
      cell(t.id, "id"),
      cell(t.partition),
      cell(t.callback_topic),
      cell(t.payload_bytes),
    );
    tr.addEventListener("click", () => showTimer(t.id));
    return tr;
  }, "no pending timers in the partitions this worker holds");
}

async function showTimer(id, withPayload = false) {
  try {
    const t = await read(timerPath(id) + (withPayload ? "?payload=1" : ""));
    state.shown = t;
    const payload = t.payload_shown ?
      `${t.payload}${t.payload_truncated ? " …" : ""} (${t.payload_bytes} bytes, ${t.payload_encoding})` :
      `${t.payload_bytes} bytes (not shown)`;
    const headers = t.headers.map((h) => (t.payload_shown ? `${h.key}=${h.value}` : `${h.key} (${h.value_bytes} bytes)`));
    const fields = [
      ["Id", t.id],
      ["Due", `${clock(t.due_ms)} (${relative(t.due_ms)})`],
      ["Partition", t.partition],
      ["Callback", `${t.callback_topic} · key ${t.callback_key}`],
      ["Payload", payload],
      ["Headers", headers.join(", ") || "–"],
      ["Token", t.has_token ? "set" : "none"],
      ["Accepted", `${clock(t.accepted_ms)} from offset ${t.source_offset}`],
    ];
    const items = fields.flatMap(([name, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = String(value);
      return [dt, dd];
    });
    $("detail-fields").replaceChildren(...items);
    $("payload-btn").hidden = t.payload_shown;
    $("timer-detail").hidden = false;
  } catch (error) {
    $("timer-detail").hidden = true;
    state.shown = null;
    const elsewhere = Object.entries((error.body && error.body.elsewhere) || {});
    const hint = elsewhere.length ? ` Other workers: ${elsewhere.map(([url, p]) => `${url} (partitions ${p.join(", ")})`).join("; ")}.` : "";
    say(`${error.message}.${hint}`, true);
  }
}

function askCancel() {
  const t = state.shown;
  if (!t) return;
  $("confirm-id").textContent = t.id;
  $("confirm-due").textContent = `${clock(t.due_ms)} (${relative(t.due_ms)})`;
  $("confirm-dialog").returnValue = "";
  $("confirm-dialog").showModal();
}

async function cancelConfirmed() {
  const t = state.shown;
  if ($("confirm-dialog").returnValue !== "yes" || !t) return;
  const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
  try {
    const result = await api(timerPath(t.id, "/cancel"), { method: "POST", headers });
    say(`Cancel sent for ${result.id} (partition ${result.partition}): it will not fire.`);
    $("timer-detail").hidden = true;
    state.shown = null;
    setTimeout(() => loadTimers(state.after).catch(report), 1500);
  } catch (error) {
    say(`Not cancelled: ${error.message}`, true);
  }
}

// -- wiring ------------------------------------------------------------------------

function report(error) {
  say(`Could not reach the worker's admin API: ${error.message}`, true);
}

async function tick(n) {
  try {
    await refreshStats(); // first: it says whether timers are read with a token
    await refreshFirings();
    if (!state.after) await loadTimers(null); // a later page stays put until asked
    if (n % 5 === 0) await refreshTimeline();
  } catch (error) {
    report(error);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = sessionStorage.getItem(TOKEN_KEY) || "";
  $("token").addEventListener("change", () => {
    sessionStorage.setItem(TOKEN_KEY, token());
    state.after = null;
    Promise.all([refreshFirings(), loadTimers(null)]).catch(report);
  });
  $("window").addEventListener("change", (e) => {
    state.window = e.target.value;
    refreshTimeline().catch(report);
  });
  $("search").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("search-id").value.trim();
    if (id) showTimer(id);
  });
  $("cancel-btn").addEventListener("click", askCancel);
  $("payload-btn").addEventListener("click", () => state.shown && showTimer(state.shown.id, true));
  $("confirm-dialog").addEventListener("close", cancelConfirmed);
  $("first-page").addEventListener("click", () => loadTimers(null).catch(report));
  $("next-page").addEventListener("click", () => loadTimers(state.nextCursor).catch(report));
  let n = 0;
  tick(n);
  setInterval(() => tick(++n), 2000);
});
