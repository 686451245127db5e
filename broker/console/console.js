// Baton's web console: polls this broker's admin JSON API (docs/admin.md) and renders it.
// No framework and no build step. Every name shown (queues, services, clients) is user
// input: it only ever reaches the page as text (textContent / text nodes), never as HTML.
"use strict";

const POLL_MS = 1500;
// A broker that is stopped (SIGSTOP) or wedged accepts the connection and never answers:
// without a deadline the page would wait forever and never say so.
const API_TIMEOUT_MS = 4000;
// A message's history replays the log from its start (docs/admin.md "Message history"):
// on a long log that takes a while, so it gets its own, longer deadline.
const HISTORY_TIMEOUT_MS = 120000;
const PEEK_COUNT = 20;
const BODY_PREVIEW = 120;  // characters of a body shown in the peek list
const HEADERS_PREVIEW = 160;
// Rates are computed here from the replicated counters of two polls (docs/admin.md).
const RATE_FIELDS = { enqueued: "publish", delivered: "deliver", accepted: "ack" };

const state = {
  prev: new Map(),     // queue name -> {t, enqueued, delivered, accepted}
  rates: new Map(),    // queue name -> {publish, deliver, ack}
  seenNodes: new Map(),  // node key -> the instance row last seen in the view
  timer: null,
  busy: false,
  detail: null,        // the queue whose detail panel is open
  historySeq: 0,       // the latest history asked: older answers are dropped
  peekSeq: 0,
  features: null,      // the last /api/features answer (for "Enable all")
  queues: new Map(),   // queue name -> its last stats (the detail panel's settings)
  split: false,        // the log has data partitions (the partitions panel shows)
  exchangeNames: null, // the exchanges the publish form lists (rebuilt when they change)
  user: null,          // who is logged in (null: the login screen shows)
  csrf: null,          // the session's CSRF token, sent on every state-changing request
};

// -- small DOM helpers (text only) -------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else if (k === "title") node.title = String(v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function setText(id, text) {
  const node = document.getElementById(id);
  if (node) node.textContent = text === undefined || text === null ? "–" : String(text);
}

function badge(text, kind) {
  return el("span", { class: "badge " + kind }, text);
}

const numberFormat = new Intl.NumberFormat("en-US");
function fmt(n) {
  return typeof n === "number" ? numberFormat.format(n) : "–";
}
function fmtRate(r) {
  if (typeof r !== "number") return "–";
  return r >= 100 ? numberFormat.format(Math.round(r)) : r.toFixed(1);
}
function short(s, n) {
  if (typeof s !== "string") return "–";
  return s.length > n ? s.slice(0, n) + "…" : s;
}
function numCell(field, value, text) {
  return el("td", { class: "num", "data-field": field }, text === undefined ? fmt(value) : text);
}

function replaceRows(tableId, rows, emptyId) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
  if (emptyId) document.getElementById(emptyId).hidden = rows.length > 0;
}

// -- the API --------------------------------------------------------------------------

async function api(method, path, body, timeoutMs) {
  const deadline = timeoutMs || API_TIMEOUT_MS;
  // X-Baton-Request: the listener answers a missing login with 401 and no Basic
  // challenge (so the browser asks nothing itself); the CSRF token goes with every
  // request that changes something (docs/admin.md "Logging in").
  const init = {
    method, headers: { Accept: "application/json", "X-Baton-Request": "console" },
    cache: "no-store", credentials: "same-origin", signal: AbortSignal.timeout(deadline),
  };
  if (method !== "GET" && state.csrf) init.headers["X-Baton-CSRF"] = state.csrf;
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let r;
  try {
    r = await fetch(path, init);
  } catch (e) {
    const why = e.name === "TimeoutError"
      ? `no answer within ${deadline / 1000} s` : e.message;
    throw new Error(`${path}: ${why}`);
  }
  let data = null;
  try {
    data = await r.json();
  } catch (e) {
    throw new Error(`${method} ${path}: HTTP ${r.status}, not JSON`);
  }
  if (!r.ok) {
    const err = new Error(data && data.error
      ? `${data.error.name}: ${data.error.message}` : `HTTP ${r.status}`);
    err.status = r.status;
    err.detail = data && data.error ? data.error.message : "";
    throw err;
  }
  return data;
}

// A figure the user may not see (403: an admin's or a monitoring user's only) shows
// as this fallback instead of failing the whole poll.
async function apiOr(path, fallback) {
  try {
    return await api("GET", path);
  } catch (e) {
    if (e.status === 403) return fallback;
    throw e;
  }
}

const enc = encodeURIComponent;
// A browser resolves a path segment "." or ".." (even percent-encoded) before it sends
// the request, so a queue with such a name cannot be named in an API path from here.
const DOT_NAME = "a browser cannot name this queue in a URL: use baton queue purge/delete";
const DOT_SERVICE = "a browser cannot name this service in a URL: use baton handover";
function pathSafe(name) {
  return name !== "." && name !== "..";
}

// -- rendering ------------------------------------------------------------------------

function renderHeader(ov, nodes) {
  setText("h-cluster", short(ov.cluster_id, 16));
  document.getElementById("h-cluster").title = ov.cluster_id || "";
  setText("h-view", ov.view);
  const leader = (nodes.instances || []).find((i) => i.leader);
  setText("h-leader", leader ? leader.node_id : "none");
  setText("h-node", `${ov.node_id} (${ov.role})`);
  setText("h-version", ov.version);
  const ready = ov.readiness || {};
  const b = document.getElementById("h-ready");
  b.textContent = ready.ready ? "ready" : "not ready";
  b.className = "badge " + (ready.ready ? "ok" : "bad");
  setText("h-updated", "updated " + new Date().toLocaleTimeString());
}

function renderCluster(ov, nodes, logInfo) {
  const ready = ov.readiness || {};
  const health = document.getElementById("c-health");
  health.replaceChildren(
    nodes.healthy ? badge("healthy", "ok") : badge("unhealthy", "bad"), " ",
    nodes.member ? badge("member", "ok") : badge("not a member", "warn"),
  );
  setText("c-reasons", (ready.reasons || []).join("; ") || "ready to serve");

  const join = nodes.join;
  if (join && join.state === "updating") {
    setText("c-join", "taking in a join update");
    setText("c-join-sub", join.progress);
  } else if (join) {
    setText("c-join", "done");
    setText("c-join-sub",
      `${fmt(join.queues)} queues, ${fmt(join.received)} messages in ${join.seconds} s`);
  } else {
    setText("c-join", "none");
    setText("c-join-sub", "first broker, or joined by replaying the log");
  }

  const cp = nodes.checkpoint;
  setText("c-checkpoint", cp ? fmt(cp.offset) : "none yet");
  const digest = document.getElementById("c-digest");
  const mismatches = nodes.digest_mismatches || 0;
  const parts = [];
  if (mismatches > 0) parts.push(badge(`${mismatches} digest mismatch(es)`, "bad"));
  else if (cp && cp.verified !== undefined) parts.push(badge("digest verified", "ok"));
  else if (cp) parts.push(badge("not verified yet", "muted"));
  if (cp) parts.push(" ", el("code", { title: cp.digest }, short(cp.digest, 12)));
  digest.replaceChildren(...parts);

  setText("c-applied", fmt(nodes.applied));
  setText("c-lag", logInfo && typeof logInfo.lag === "number"
    ? `${fmt(logInfo.lag)} records behind the log` : "log end unknown");

  // Members in view order. A broker seen earlier but no longer in the view keeps its row,
  // marked gone, so an operator sees who left (the API lists members only).
  const inView = new Set();
  const rows = [];
  (nodes.instances || []).forEach((inst, i) => {
    const key = `${inst.node_id}/${inst.runtime}`;
    inView.add(key);
    state.seenNodes.set(key, inst);
    const status = [];
    if (inst.leader) status.push(badge("leader", "lead"));
    status.push(inst.role === "observer" ? badge("observer", "muted") : badge("member", "ok"));
    if (inst.suspected) status.push(badge("suspected: silent", "warn"));
    if (inst.local) status.push(badge("this broker", "muted"));
    const rowStatus = inst.suspected ? "suspected" : "member";
    rows.push(el("tr", { class: rowStatus, "data-node": inst.node_id, "data-status": rowStatus },
      numCell("index", i + 1),
      el("td", {}, inst.node_id),
      el("td", { title: inst.runtime }, el("code", {}, short(inst.runtime, 8))),
      el("td", {}, inst.role),
      el("td", {}, el("code", {}, inst.address || "–")),
      el("td", { class: "badges" }, ...status)));
  });
  for (const [key, inst] of state.seenNodes) {
    if (inView.has(key)) continue;
    rows.push(el("tr", { class: "gone", "data-node": inst.node_id, "data-status": "gone" },
      el("td", {}, ""),
      el("td", {}, inst.node_id),
      el("td", { title: inst.runtime }, el("code", {}, short(inst.runtime, 8))),
      el("td", {}, inst.role),
      el("td", {}, el("code", {}, inst.address || "–")),
      el("td", { class: "badges" }, badge("gone: left the view", "bad"))));
  }
  replaceRows("nodes", rows);
}

// The log's data partitions as this broker applied them (docs/admin.md "GET /api/nodes":
// ``partitions``, absent for a log of one, which shows no panel), and each one's replica
// group (``groups``: also the partitions this broker does not apply, shown as applied by
// other brokers; a group with fewer than a majority of its replicas live is flagged).
function renderPartitions(nodes) {
  const parts = Array.isArray(nodes.partitions) ? nodes.partitions : null;
  state.split = parts !== null;
  document.getElementById("partitions-section").hidden = !state.split;
  if (!state.split) {
    replaceRows("partitions", []);
    return;
  }
  const open = parts.length;
  const count = nodes.partition_count ?? open;
  setText("pt-count", count === open ? fmt(count) : `${fmt(open)} of ${fmt(count)} open here`);
  const groups = new Map((Array.isArray(nodes.groups) ? nodes.groups : [])
    .map((g) => [g.partition, g]));
  const here = new Map(parts.map((p) => [p.partition, p]));
  const numbers = [...new Set([...here.keys(), ...groups.keys()])].sort((a, b) => a - b);
  const rows = numbers.map((k) => {
    const p = here.get(k);
    const g = groups.get(k);
    const status = [];
    const flag = groupShort(g);
    if (flag) status.push(badge(flag, "bad"));
    if (p === undefined) {
      status.push(badge("applied by other brokers", "muted"));
      const none = (field) => el("td", { class: "num", "data-field": field }, "–");
      return el("tr", { "data-partition": k, class: "elsewhere" },
        numCell("partition", k),
        el("td", { "data-field": "leader" }, "–"),
        el("td", { class: "badges", "data-field": "status" }, ...status),
        groupCell(g),
        none("queues"), none("applied"), none("lag"), none("checkpoint"),
        none("forwards_pending"), none("dead_letters_in_flight"));
    }
    status.push(p.member ? badge("member", "ok") : badge("not a member", "warn"));
    status.push(p.healthy ? badge("healthy", "ok") : badge("unhealthy", "bad"));
    if (p.digest_mismatches > 0) {
      status.push(badge(`${p.digest_mismatches} digest mismatch(es)`, "bad"));
    }
    const known = typeof p.lag === "number";
    const cp = p.checkpoint;
    return el("tr", { "data-partition": p.partition },
      numCell("partition", p.partition),
      el("td", { "data-field": "leader", title: p.leader || "" },
        p.leader ? ownerName(p.leader) : badge("no leader", "warn")),
      el("td", { class: "badges", "data-field": "status" }, ...status),
      groupCell(g),
      numCell("queues", p.queues),
      numCell("applied", p.applied),
      el("td", { class: "num", "data-field": "lag", "data-known": known ? "yes" : "no" },
        known ? fmt(p.lag) : badge("unknown", "muted")),
      numCell("checkpoint", cp ? cp.offset : null, cp ? fmt(cp.offset) : "none yet"),
      numCell("forwards_pending", p.forwards_pending),
      numCell("dead_letters_in_flight", p.dead_letters_in_flight));
  });
  replaceRows("partitions", rows);
}

// A group with fewer than a majority of its replicas live: its view cannot change and
// its queues wait (docs/operations.md "Replica groups"); null when it has a majority.
function groupShort(g) {
  if (!g || !Array.isArray(g.replicas) || g.replicas.length === 0) return null;
  const size = g.replicas.length;
  if (g.live_replicas >= Math.floor(size / 2) + 1) return null;
  return `no majority: ${g.live_replicas} of ${size} live`;
}

// A partition's replica group: its brokers, those joining, live of all.
function groupCell(g) {
  if (!g || !Array.isArray(g.replicas)) {
    return el("td", { "data-field": "group" }, badge("every broker", "muted"));
  }
  const parts = [el("span", { class: "replicas" }, g.replicas.join(", ") || "none"),
    " ", el("span", { class: "muted", "data-field": "live" },
      `(${g.live_replicas}/${g.group_size} live)`)];
  if (Array.isArray(g.joining) && g.joining.length) {
    parts.push(" ", badge(`joining ${g.joining.join(", ")}`, "warn"));
  }
  return el("td", { "data-field": "group" }, ...parts);
}

function updateRates(queues) {
  const now = performance.now();
  const names = new Set();
  for (const q of queues) {
    names.add(q.queue);
    const prev = state.prev.get(q.queue);
    const cur = { t: now, enqueued: q.enqueued, delivered: q.delivered, accepted: q.accepted };
    if (prev && now > prev.t) {
      const dt = (now - prev.t) / 1000;
      const rates = {};
      for (const [field, rate] of Object.entries(RATE_FIELDS)) {
        const d = (cur[field] ?? 0) - (prev[field] ?? 0);
        rates[rate] = d >= 0 ? d / dt : 0;  // a queue deleted and declared again
      }
      state.rates.set(q.queue, rates);
    }
    state.prev.set(q.queue, cur);
  }
  for (const name of [...state.prev.keys()]) {
    if (!names.has(name)) { state.prev.delete(name); state.rates.delete(name); }
  }
}

function ownerName(owner) {
  if (!owner) return "–";
  return owner.split("/")[0];
}

function renderQueues(queues) {
  state.queues = new Map(queues.map((q) => [q.queue, q]));
  renderSettings();
  updateRates(queues);
  setText("q-count", queues.length);
  const rows = queues.map((q) => {
    const r = state.rates.get(q.queue) || {};
    const safe = pathSafe(q.queue);
    const badges = [];
    if (q.updating) badges.push(" ", badge("updating", "warn"));
    if (q.reserved_by) badges.push(" ", badge("reserved", "muted"));
    return el("tr", { "data-queue": q.queue },
      el("td", { class: "name", "data-field": "queue" },
        el("button", { type: "button", class: "linkish", "data-action": "open",
          disabled: safe ? null : "", title: safe ? "Peek and message histories" : DOT_NAME,
          onclick: () => openDetail(q.queue) }, q.queue), ...badges),
      numCell("ready", q.ready),
      numCell("acquired", q.acquired),
      numCell("consumers", q.consumers),
      el("td", { class: "num partition", "data-field": "partition" }, fmt(q.partition)),
      numCell("publish_rate", r.publish, fmtRate(r.publish)),
      numCell("deliver_rate", r.deliver, fmtRate(r.deliver)),
      numCell("ack_rate", r.ack, fmtRate(r.ack)),
      numCell("dead_lettered", q.dead_lettered),
      el("td", { title: q.owner || "" }, ownerName(q.owner)),
      el("td", { "data-field": "policy" }, q.policy || "–"),
      el("td", { class: "actions" },
        el("button", { class: "btn small", "data-action": "purge",
          disabled: safe ? null : "", title: safe ? null : DOT_NAME,
          onclick: () => confirmThen("Purge queue",
            `Drop every ready message of queue “${q.queue}”? Acquired messages stay.`,
            "Purge", () => api("POST", `/api/queues/${enc(q.queue)}/purge`),
            (res) => `Purged ${fmt(res.purged)} message(s) from “${q.queue}”.`) }, "Purge"),
        " ",
        el("button", { class: "btn small danger", "data-action": "delete",
          disabled: safe ? null : "", title: safe ? null : DOT_NAME,
          onclick: () => confirmThen("Delete queue",
            `Delete queue “${q.queue}” with its ${fmt(q.ready + q.acquired)} message(s)?`,
            "Delete", () => api("DELETE", `/api/queues/${enc(q.queue)}`),
            (res) => `Deleted “${q.queue}” (${fmt(res.deleted)} message(s)).`) }, "Delete")));
  });
  document.getElementById("queues").classList.toggle("split", state.split);
  replaceRows("queues", rows, "queues-empty");
}

function renderConnections(conns) {
  const rows = conns.map((c) => el("tr", { "data-connection": c.id },
    el("td", {}, el("code", {}, c.id)),
    el("td", {}, c.client_name || "–"),
    numCell("in_flight", c.in_flight),
    numCell("consumers", (c.consumers || []).length),
    el("td", { class: "actions" },
      el("button", { class: "btn small danger", "data-action": "close",
        onclick: () => confirmThen("Close connection",
          `Close the client connection ${c.id}${c.client_name ? ` (${c.client_name})` : ""}?` +
          " Its consumers end and their unsettled messages go back to their queues.",
          "Close", () => api("DELETE", `/api/connections/${enc(c.id)}`),
          () => `Closed connection ${c.id}.`) }, "Close"))));
  replaceRows("connections", rows, "connections-empty");
}

function renderConsumers(consumers) {
  const rows = consumers.map((c) => el("tr", { "data-consumer": c.tag },
    el("td", {}, c.queue),
    el("td", { title: c.consumer_id }, el("code", {}, short(String(c.tag), 24))),
    el("td", {}, el("code", {}, c.connection)),
    numCell("prefetch", c.prefetch),
    numCell("held", c.held)));
  replaceRows("consumers", rows, "consumers-empty");
}

function renderServices(services) {
  const rows = services.map((s) => el("tr", { "data-service": s.service },
    el("td", {}, s.service),
    el("td", { title: s.leader || "" },
      s.leader ? el("code", {}, short(s.leader, 40)) : badge("no leader", "warn")),
    numCell("token", s.token),
    numCell("candidates", (s.candidates || []).length),
    el("td", {}, s.handover_requested ? badge("requested", "warn") : "–"),
    el("td", { class: "actions" },
      el("button", { class: "btn small", "data-action": "handover",
        disabled: (s.candidates || []).length < 2 || !pathSafe(s.service) ? "" : null,
        title: pathSafe(s.service) ? null : DOT_SERVICE,
        onclick: () => confirmThen("Hand over",
          `Ask the leader of service “${s.service}” to hand over to another candidate?`,
          "Hand over", () => api("POST", `/api/services/${enc(s.service)}/handover`, {}),
          () => `Handover of “${s.service}” asked.`) }, "Hand over"))));
  replaceRows("services", rows, "services-empty");
}

function renderLog(info) {
  for (const td of document.querySelectorAll("#log td[data-field]")) {
    const v = info[td.dataset.field];
    td.textContent = typeof v === "number" ? fmt(v) : (v === null || v === undefined ? "–" : v);
  }
}

// -- feature flags (docs/operations.md "Upgrading") --------------------------------------

// -- exchanges, bindings and policies ------------------------------------------------------

const DEFAULT_EXCHANGE = "amq.default";  // the default exchange ("") in an API path
function exchangeName(name) {
  return name === "" ? "(default)" : name;
}

function renderExchanges(exchanges) {
  setText("x-count", exchanges.length);
  replaceRows("exchanges", exchanges.map((x) => el("tr", { "data-exchange": x.exchange },
    el("td", { class: "name", "data-field": "exchange" }, exchangeName(x.exchange)),
    el("td", { "data-field": "type" }, x.type),
    el("td", {}, x.durable ? "yes" : "no"),
    el("td", {}, [x.auto_delete ? "auto-delete" : "", x.internal ? "internal" : ""]
      .filter(Boolean).join(", ") || "–"),
    numCell("bindings", x.bindings.length))));
  const bindings = exchanges.flatMap((x) => x.bindings.map((b) => ({ exchange: x.exchange, ...b })));
  replaceRows("bindings", bindings.map((b) => el("tr", { "data-binding": `${b.exchange} ${b.queue}` },
    el("td", { "data-field": "exchange" }, exchangeName(b.exchange)),
    el("td", { "data-field": "queue" }, b.queue),
    el("td", { "data-field": "routing_key" }, el("code", {}, b.routing_key)),
    el("td", {}, Object.keys(b.arguments || {}).length
      ? el("code", {}, JSON.stringify(b.arguments)) : "–"))), "bindings-empty");
  // The publish form's exchanges: those one may publish to (not internal), kept selected.
  const select = document.getElementById("xp-exchange");
  const chosen = select.value;
  const names = exchanges.filter((x) => !x.internal).map((x) => x.exchange);
  if (names.join("\u0000") !== state.exchangeNames) {
    state.exchangeNames = names.join("\u0000");
    select.replaceChildren(...names.map((n) => el("option",
      { value: n === "" ? DEFAULT_EXCHANGE : n }, exchangeName(n))));
    if (chosen) select.value = chosen;
  }
}

function renderPolicies(policies) {
  setText("p-count", policies.length);
  replaceRows("policies", policies.map((p) => el("tr", { "data-policy": p.name },
    el("td", { class: "name", "data-field": "name" }, p.name),
    el("td", { "data-field": "pattern" }, el("code", {}, p.pattern)),
    el("td", { "data-field": "apply_to" }, p.apply_to),
    numCell("priority", p.priority),
    el("td", { "data-field": "definition" }, el("code", {}, JSON.stringify(p.definition))),
    el("td", { class: "actions" },
      el("button", { class: "btn small danger", "data-action": "clear",
        disabled: pathSafe(p.name) ? null : "",
        onclick: () => confirmThen("Clear policy",
          `Clear policy “${p.name}”? Its queues go back to their declared settings` +
          " (or to the next policy that matches them).",
          "Clear", () => api("DELETE", `/api/policies/${enc(p.name)}`),
          (res) => `Cleared policy “${p.name}”; ${fmt(res.queues)} queue(s) have a policy now.`) },
        "Clear")))), "policies-empty");
}

// Parses a form's optional JSON object field; throws with a message naming it.
function jsonField(id, what, required) {
  const text = document.getElementById(id).value.trim();
  if (!text && !required) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new Error(`${what} is not JSON: ${e.message}`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error(`${what} must be a JSON object`);
  }
  return value;
}

function routedText(res, where) {
  if (!res.queues.length) return `Published through ${where}: it reached no queue.`;
  const full = res.full && res.full.length ? ` (refused, full: ${res.full.join(", ")})` : "";
  return `Published through ${where} to ${res.queues.join(", ")}${full}.`;
}

async function submitAction(title, action, done) {
  try {
    notice(done(await action()), "ok");
  } catch (e) {
    notice(`${title} failed: ${e.message}`, "bad");
  }
  poll();
}

function setUpExchanges() {
  document.getElementById("xp-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const exchange = document.getElementById("xp-exchange").value;
    submitAction("Publish", () => api("POST", `/api/exchanges/${enc(exchange)}/publish`, {
      routing_key: document.getElementById("xp-key").value,
      body: document.getElementById("xp-body").value,
      headers: jsonField("xp-headers", "Headers", false),
    }), (res) => routedText(res, `exchange “${exchange}”`));
  });
  document.getElementById("pa-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const name = document.getElementById("pa-name").value;
    submitAction("Add policy", () => {
      if (!pathSafe(name)) throw new Error(DOT_NAME);
      return api("PUT", `/api/policies/${enc(name)}`, {
        pattern: document.getElementById("pa-pattern").value,
        apply_to: document.getElementById("pa-apply").value,
        priority: Number(document.getElementById("pa-priority").value || "0"),
        definition: jsonField("pa-definition", "The definition", true),
      });
    }, (res) => `Policy “${name}” ${res.changed ? "added" : "replaced"};` +
      ` ${fmt(res.queues)} queue(s) have a policy now.`);
  });
}

const FLAG_BADGE = { enabled: "ok", disabled: "warn", unknown: "bad" };
const FLAG_STATE = { enabled: "enabled", disabled: "disabled", unknown: "unknown: a newer build's" };

// A member key ("node/runtime") shown by its node id; its key and address in the title.
function memberBadges(keys, kind, addresses) {
  if (!keys || keys.length === 0) return ["–"];
  return keys.map((k) => {
    const addr = addresses.get(k);
    return el("span", { class: "badge " + kind, "data-member": k,
      title: addr ? `${k} at ${addr}` : k }, k.split("/")[0]);
  });
}

function enabledText(res) {
  return res.enabled.length
    ? `Enabled ${res.enabled.join(", ")}; the cluster's format is ${res.format}.`
    : `Nothing changed: already enabled (the cluster's format is ${res.format}).`;
}

function enableFlags(title, names, lacking) {
  const what = names === null ? "every feature flag this broker's build knows"
    : `feature flag “${names[0]}”`;
  const warn = lacking.length
    ? ` ${lacking.join(", ")} ${lacking.length > 1 ? "do" : "does"} not support it yet:` +
      " the broker will refuse until it is upgraded."
    : "";
  confirmThen(title,
    `Enable ${what} for good? A flag cannot be disabled: a broker whose build lacks it ` +
    `can no longer join this cluster.${warn}`,
    "Enable", () => api("POST", "/api/features/enable",
      names === null ? { all: true } : { names }), enabledText);
}

function renderFeatures(f, nodes) {
  state.features = f;
  const addresses = new Map((nodes.instances || []).map(
    (i) => [`${i.node_id}/${i.runtime}`, i.address]));
  setText("f-format", `cluster format ${f.format}`);
  const rows = f.features.map((flag) => {
    const lacking = (flag.unsupported_by || []).map((k) => k.split("/")[0]);
    return el("tr", { "data-flag": flag.name, "data-state": flag.state },
      el("td", { class: "flag name", "data-field": "name" }, flag.name,
        el("span", { class: "doc" }, flag.doc)),
      el("td", { "data-field": "state" },
        badge(FLAG_STATE[flag.state] || flag.state, FLAG_BADGE[flag.state] || "muted")),
      numCell("format", flag.format, flag.state === "unknown" ? "?" : fmt(flag.format)),
      el("td", { "data-field": "since" }, flag.since || "–"),
      el("td", { class: "badges", "data-field": "supported_by" },
        ...memberBadges(flag.supported_by, "ok", addresses)),
      el("td", { class: "badges", "data-field": "unsupported_by" },
        ...memberBadges(flag.unsupported_by, "bad", addresses)),
      el("td", { class: "actions" }, flag.state !== "disabled" ? "" :
        el("button", { class: "btn small", "data-action": "enable",
          title: lacking.length ? `not supported by ${lacking.join(", ")} yet` : null,
          onclick: () => enableFlags("Enable feature flag", [flag.name], lacking) },
          "Enable")));
  });
  replaceRows("features", rows, "features-empty");
  document.getElementById("f-enable-all").disabled =
    !f.features.some((flag) => flag.state === "disabled");
}

function setUpFeatures() {
  document.getElementById("f-enable-all").addEventListener("click", () => {
    const flags = (state.features && state.features.features) || [];
    const lacking = [...new Set(flags.filter((flag) => flag.state === "disabled")
      .flatMap((flag) => flag.unsupported_by || []).map((k) => k.split("/")[0]))];
    enableFlags("Enable all feature flags", null, lacking);
  });
}

// -- the queue's detail panel: peek, and a message's history --------------------------

function utc(ms) {
  if (typeof ms !== "number") return "–";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

function bodyPreview(m) {
  if (typeof m.body_utf8 === "string") {
    return el("code", { title: short(m.body_utf8, 2000) }, short(m.body_utf8, BODY_PREVIEW));
  }
  const size = atob(m.body || "").length;
  return el("span", {}, badge(`binary, ${fmt(size)} B`, "muted"), " ",
    el("code", { title: "base64" }, short(m.body || "", BODY_PREVIEW)));
}

function headersPreview(headers) {
  const entries = Object.entries(headers || {});
  if (entries.length === 0) return "–";
  const text = entries.map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(", ");
  return el("code", { title: short(text, 2000) }, short(text, HEADERS_PREVIEW));
}

const SETTINGS = [
  ["max_length", "max-length"], ["overflow", "overflow"], ["message_ttl_ms", "message-ttl"],
  ["delivery_limit", "delivery-limit"], ["dead_letter", "dead-letter"],
  ["dead_letter_exchange", "dead-letter-exchange"],
  ["dead_letter_routing_key", "dead-letter-routing-key"], ["retry", "retry"],
];

// The open queue's effective settings and the policy that gave them, from the last poll.
function renderSettings() {
  if (state.detail === null) return;
  const q = state.queues.get(state.detail);
  if (!q) return;
  const parts = SETTINGS.filter(([f]) => q[f] !== null && q[f] !== undefined)
    .map(([f, label]) => `${label} ${q[f]}`);
  setText("d-settings", parts.join(" · ") || "none");
  const policy = document.getElementById("d-policy");
  policy.textContent = q.policy || "none";
  policy.className = "badge " + (q.policy ? "ok" : "muted");
  // Its data partition, on a log of several only (a one-log cluster's queues have one).
  document.getElementById("d-partition-wrap").hidden = !state.split;
  setText("d-partition", fmt(q.partition));
}

async function getMessages() {
  const queue = state.detail;
  if (queue === null) return;
  const count = Number(document.getElementById("qg-count").value || "1");
  const ack = document.getElementById("qg-mode").value === "ack";
  detailError("");
  try {
    const res = await api("POST", `/api/queues/${enc(queue)}/get`, { count, ack });
    if (state.detail !== queue) return;
    const rows = res.messages.map((m) => el("tr", { "data-position": m.position },
      numCell("position", m.position), numCell("delivery_count", m.delivery_count),
      el("td", {}, headersPreview(m.headers)), el("td", {}, bodyPreview(m))));
    replaceRows("got", rows, "got-empty");
    document.getElementById("got").hidden = rows.length === 0;
    notice(`Got ${rows.length} message(s) from “${queue}” and ` +
      `${ack ? "acked them (removed)" : "requeued them"}.`, "ok");
  } catch (e) {
    detailError(`Get failed: ${e.message}`);
  }
  poll();
  refreshPeek();
}

function publishToQueue() {
  const queue = state.detail;
  if (queue === null) return;
  submitAction("Publish", () => api("POST", `/api/queues/${enc(queue)}/publish`, {
    body: document.getElementById("qp-body").value,
    headers: jsonField("qp-headers", "Headers", false),
  }), (res) => routedText(res, "the default exchange")).then(refreshPeek);
}

function detailError(message) {
  const box = document.getElementById("d-error");
  box.textContent = message;
  box.hidden = !message;
}

function openDetail(queue) {
  state.detail = queue;
  state.historySeq++;  // an answer for the previous queue must not show
  const section = document.getElementById("detail");
  section.hidden = false;
  setText("d-queue", queue);
  detailError("");
  document.getElementById("h-result").hidden = true;
  document.getElementById("h-loading").hidden = true;
  document.getElementById("h-position").value = "";
  replaceRows("peek", []);
  document.getElementById("peek-empty").hidden = true;
  replaceRows("got", [], "got-empty");
  document.getElementById("got").hidden = true;
  document.getElementById("got-empty").hidden = true;
  renderSettings();
  refreshPeek();
  section.scrollIntoView({ block: "nearest" });
}

function closeDetail() {
  state.detail = null;
  state.historySeq++;
  state.peekSeq++;
  document.getElementById("detail").hidden = true;
}

async function refreshPeek() {
  const queue = state.detail;
  if (queue === null) return;
  const seq = ++state.peekSeq;
  const loading = document.getElementById("peek-loading");
  loading.hidden = false;
  try {
    const res = await api("GET", `/api/queues/${enc(queue)}/peek?count=${PEEK_COUNT}`);
    if (seq !== state.peekSeq) return;
    const selected = document.getElementById("h-position").value;
    const rows = res.messages.map((m) => el("tr", {
      "data-position": m.position,
      class: String(m.position) === selected ? "selected" : null },
      el("td", { class: "num", "data-field": "position" },
        el("button", { type: "button", class: "linkish", "data-action": "history",
          title: "Show this message's history",
          onclick: () => showHistory(m.position) }, String(m.position))),
      numCell("delivery_count", m.delivery_count),
      el("td", { "data-field": "published" }, utc(m.publish_time_ms)),
      el("td", { class: "headers", "data-field": "headers" }, headersPreview(m.headers)),
      el("td", { class: "body", "data-field": "body" }, bodyPreview(m))));
    replaceRows("peek", rows, "peek-empty");
    detailError("");
  } catch (e) {
    if (seq !== state.peekSeq) return;
    replaceRows("peek", []);
    detailError(`Peek failed: ${e.message}`);
  } finally {
    if (seq === state.peekSeq) loading.hidden = true;
  }
}

function stepDetails(step) {
  const parts = [];
  const kv = (k, v) => parts.push(el("span", { class: "kvp" },
    el("span", { class: "k" }, k + " "), el("code", {}, String(v))));
  if (step.consumer !== undefined) kv("consumer", step.consumer);
  if (step.acquisition !== undefined) kv("acquisition", step.acquisition);
  if (step.delivery_count !== undefined) kv("delivery count", step.delivery_count);
  if (step.failed !== undefined) kv("failed", step.failed ? "yes" : "no (not now)");
  if (step.publish_key !== undefined) kv("publish key", step.publish_key);
  if (step.reason !== undefined) kv("reason", step.reason);
  if (step.to_queue !== undefined) kv("to", `${step.to_queue} @ ${step.to_position ?? "?"}`);
  if (step.event !== undefined) kv("event", step.event);
  if (step.note) parts.push(el("span", { class: "note" }, step.note));
  return parts;
}

const STATE_BADGE = { ready: "ok", acquired: "warn", gone: "muted", absent: "bad" };
const WHAT_BADGE = {
  enqueued: "ok", acquired: "lead", released: "warn", accepted: "ok",
  "dead-lettered": "bad", purged: "bad", "deleted with its queue": "bad", removed: "bad",
};

function renderHistory(h) {
  setText("h-pos", fmt(h.position));
  const st = document.getElementById("h-state");
  st.textContent = h.state;
  st.className = "badge " + (STATE_BADGE[h.state] || "muted");
  setText("h-scanned", `${fmt(h.scanned)} log records read (offsets ${fmt(h.log_start)}` +
    `–${fmt(h.log_end)})${h.complete ? "" : ", incomplete"}`);
  const note = document.getElementById("h-note");
  note.textContent = h.note || "";
  note.hidden = !h.note;
  const rows = (h.steps || []).map((s) => el("tr", { "data-what": s.what },
    numCell("offset", s.offset),
    el("td", { "data-field": "time", class: "num" }, utc(s.time_ms)),
    el("td", { "data-field": "node", title: s.runtime || "" }, s.node || "–"),
    el("td", { "data-field": "what" }, badge(s.what, WHAT_BADGE[s.what] || "muted")),
    el("td", { class: "details", "data-field": "details" }, ...stepDetails(s))));
  replaceRows("history", rows);
  document.getElementById("history").hidden = rows.length === 0;
  const empty = document.getElementById("history-empty");
  empty.textContent = h.state === "absent"
    ? `Not found: the log has no message at position ${h.position} of this queue ` +
      "(never enqueued, or not in the part of the log read)."
    : "The log names no event for this position.";
  empty.hidden = rows.length > 0;
  document.getElementById("h-result").hidden = false;
}

async function showHistory(position) {
  const queue = state.detail;
  if (queue === null) return;
  const seq = ++state.historySeq;
  document.getElementById("h-position").value = String(position);
  for (const row of document.querySelectorAll("#peek tbody tr")) {
    row.classList.toggle("selected", row.dataset.position === String(position));
  }
  const loading = document.getElementById("h-loading");
  loading.hidden = false;
  document.getElementById("h-result").hidden = true;
  detailError("");
  try {
    const h = await api("GET", `/api/queues/${enc(queue)}/messages/${enc(position)}/history`,
      undefined, HISTORY_TIMEOUT_MS);
    if (seq !== state.historySeq) return;
    renderHistory(h);
  } catch (e) {
    if (seq !== state.historySeq) return;
    detailError(`History of position ${position} failed: ${e.message}`);
  } finally {
    if (seq === state.historySeq) loading.hidden = true;
  }
}

function setUpDetail() {
  document.getElementById("d-close").addEventListener("click", closeDetail);
  document.getElementById("d-refresh").addEventListener("click", refreshPeek);
  document.getElementById("qg-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    getMessages();
  });
  document.getElementById("qp-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    publishToQueue();
  });
  document.getElementById("h-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const raw = document.getElementById("h-position").value.trim();
    if (!/^\d+$/.test(raw)) {
      detailError("A position is a whole number, 0 or more.");
      return;
    }
    showHistory(raw.replace(/^0+(?=\d)/, ""));
  });
}

// -- the confirm step and actions -------------------------------------------------------

function notice(text, kind) {
  const n = document.getElementById("notice");
  n.textContent = text;
  n.className = "notice " + (kind || "ok");
  n.hidden = false;
}

function confirmThen(title, text, okLabel, action, done) {
  const dialog = document.getElementById("confirm-dialog");
  setText("confirm-title", title);
  setText("confirm-text", text);
  setText("confirm-ok", okLabel);
  dialog.returnValue = "";
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "ok") return;
    try {
      const res = await action();
      notice(done(res), "ok");
    } catch (e) {
      notice(`${title} failed: ${e.message}`, "bad");
    }
    poll();
  }, { once: true });
  dialog.showModal();
}

// -- polling -----------------------------------------------------------------------------

function showError(message) {
  const banner = document.getElementById("error-banner");
  banner.textContent = message;
  banner.hidden = false;
  document.body.classList.add("stale");
}

function clearError() {
  document.getElementById("error-banner").hidden = true;
  document.body.classList.remove("stale");
}

async function poll() {
  if (state.busy || !state.user) return;
  state.busy = true;
  try {
    const [ov, nodes, queues, conns, consumers, services, logInfo, features, exchanges,
      policies] = await Promise.all([
        api("GET", "/api/overview"), api("GET", "/api/nodes"), api("GET", "/api/queues"),
        apiOr("/api/connections", { connections: [] }),
        apiOr("/api/consumers", { consumers: [] }),
        api("GET", "/api/services"), apiOr("/api/log", {}), api("GET", "/api/features"),
        api("GET", "/api/exchanges"), api("GET", "/api/policies"),
      ]);
    if (!state.user) return;  // logged out meanwhile
    clearError();
    renderHeader(ov, nodes);
    renderCluster(ov, nodes, logInfo);
    renderPartitions(nodes);
    renderQueues(queues.queues);
    renderConnections(conns.connections);
    renderConsumers(consumers.consumers);
    renderServices(services.services);
    renderLog(logInfo);
    renderFeatures(features, nodes);
    renderExchanges(exchanges.exchanges);
    renderPolicies(policies.policies);
  } catch (e) {
    if (e.status === 401) {
      showLogin("Your session ended (idle too long, logged out, or the user changed):"
        + " log in again.");
      return;
    }
    showError(`The admin API is unreachable or failing (${e.message}). ` +
      "Showing the last figures received; retrying every " + POLL_MS / 1000 + " s.");
  } finally {
    state.busy = false;
  }
}

// -- logging in and out ------------------------------------------------------------------

function loggedIn(who) {
  state.user = who.user;
  state.csrf = who.csrf;
  document.getElementById("login").hidden = true;
  document.getElementById("main").hidden = false;
  document.getElementById("logout").hidden = false;
  setText("h-user", "user " + who.user + (who.admin ? " (admin)" : ""));
  poll();
  if (state.timer === null) state.timer = setInterval(poll, POLL_MS);
}

function showLogin(errorText, infoText) {
  if (state.timer !== null) clearInterval(state.timer);
  state.timer = null;
  state.user = null;
  state.csrf = null;
  document.getElementById("main").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("h-user").textContent = "";
  clearError();
  const error = document.getElementById("login-error");
  error.textContent = errorText || "";
  error.hidden = !errorText;
  const info = document.getElementById("login-info");
  info.textContent = infoText || "";
  info.hidden = !infoText;
  document.getElementById("login").hidden = false;
  document.getElementById("login-password").value = "";
}

function setUpLogin() {
  document.getElementById("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const user = document.getElementById("login-user").value;
    const password = document.getElementById("login-password").value;
    const button = document.getElementById("login-submit");
    button.disabled = true;
    try {
      loggedIn(await api("POST", "/api/login", { user, password }));
    } catch (e) {
      showLogin(e.status === 401
        ? "Login failed: " + (e.detail || "wrong user name or password")
        : "Login failed: " + e.message);
    } finally {
      button.disabled = false;
    }
  });
  document.getElementById("logout").addEventListener("click", async () => {
    try {
      await api("POST", "/api/logout");
    } catch (e) {
      // Ended anyway (expired): the login screen says nothing more.
    }
    showLogin("", "Logged out.");
  });
}

document.addEventListener("DOMContentLoaded", async () => {
  setUpDetail();
  setUpFeatures();
  setUpExchanges();
  setUpLogin();
  try {
    const who = await api("GET", "/api/session");  // a session cookie still good?
    if (who.user) loggedIn(who);
    else showLogin("");
  } catch (e) {
    showLogin("The admin API cannot be reached: " + e.message);
  }
});
