// The cluster console's page: reads the topology document from the event stream
// (console/events) and draws it. Read-only; every string from the document goes into the page
// through textContent or an attribute, never as HTML (group and member names come from etcd).
"use strict";

(function () {
  const EVENTS = "console/events";
  // A stream answered with an error status (503: too many viewers) is closed by the browser
  // for good; the page opens a new one after this.
  const REFUSED_RETRY_MS = 10000;

  // Why a failover cannot happen now, in words (docs/failover.md, "Blocked reasons").
  const BLOCKED = {
    paused: "an operator paused automatic failover",
    state_behind_members:
      "a member reports a higher epoch than the state record, as after a restore of an old etcd backup; the state is rebuilt first",
    hold_down: "the group failed over moments ago; the hold-down stops flapping",
    rate_limited: "the group reached its failovers per minute",
    concurrency_limited: "as many groups as allowed are in a decision already",
    sync_degraded: "SYNC with k = 0: no member but the master is known to hold every acknowledged record",
    async_failover_disabled: "an ASYNC group and coordinator.async-failover = false",
    async_lag_too_large: "ASYNC: the best candidate lags by more than max-lag-on-failover",
    no_voters_reachable: "no voter other than the master has a live record, or none answered the fence",
    master_alive: "a majority of the voters still hears from the master",
    too_few_fenced: "fewer than |V| - k voters are fenced at the new epoch",
    best_candidate_not_promotable: "only never-promote members hold the most data",
    candidate_below_confirm_offset: "alarm: the chosen member ends below the published confirm offset",
    not_bootstrapped: "the group has members but no state record yet",
  };

  // The members table's columns: heading, and what it means (the heading's tooltip).
  const MEMBER_COLUMNS = [
    ["member", "the member's name"],
    ["role", "the role its member record reports"],
    ["epoch", "the epoch it runs"],
    ["max offset", "the end of its commitlog, in bytes"],
    ["readable", "its readable end: what consumers may read"],
    ["lag", "bytes behind the master"],
    ["lag time", "how far behind the master, in time"],
    ["in sync", "whether its acks count for a SYNC put now"],
    ["lease", "the age of its member record, renewed with its lease"],
  ];

  const state = { doc: null, updates: 0, lastConnectedMs: null, stream: "connecting", source: null };

  function $(id) {
    return document.getElementById(id);
  }

  // An element with attributes (class, data-*, title) and children (strings become text).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function present(v) {
    return v !== null && v !== undefined;
  }

  function bytes(n) {
    if (!present(n)) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let v = Number(n);
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
  }

  function millis(n) {
    if (!present(n)) return "—";
    const ms = Number(n);
    if (ms < 1000) return `${ms} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
    const s = Math.floor(ms / 1000);
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function count(n) {
    return present(n) ? Number(n).toLocaleString("en-US") : "—";
  }

  function two(n) {
    return String(n).padStart(2, "0");
  }

  // A wall-clock time: hh:mm:ss today, with the date otherwise.
  function clock(unixMs) {
    if (!present(unixMs) || unixMs <= 0) return "—";
    const d = new Date(Number(unixMs));
    const t = `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
    const now = new Date();
    if (d.toDateString() === now.toDateString()) return t;
    return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${t}`;
  }

  function ago(unixMs) {
    if (!present(unixMs) || unixMs <= 0) return "";
    return `${millis(Math.max(0, Date.now() - Number(unixMs)))} ago`;
  }

  function yesNo(v, good) {
    if (!present(v)) return el("span", { class: "muted" }, "—");
    return el("span", { class: v === good ? "ok" : "bad" }, v ? "yes" : "no");
  }

  function blockedText(reason) {
    if (!present(reason) || reason === "") return "no reason given";
    const words = BLOCKED[reason];
    return words ? `${words} (${reason})` : reason;
  }

  // ---- a group's card ---------------------------------------------------------------------

  function fact(name, ...value) {
    return el("div", { class: "fact" }, el("dt", {}, name), el("dd", {}, ...value));
  }

  function failoverFact(g) {
    if (g.failover_possible) {
      return fact("failover", el("span", { class: "ok", "data-failover-text": "" }, "possible now"));
    }
    const why = el("span", { class: "bad", "data-failover-text": "" },
      `not possible: ${blockedText(g.blocked_reason)}`);
    return fact("failover", why);
  }

  function memberNotes(m) {
    const notes = [];
    if (!m.live) notes.push("no live record (lease expired or never held)");
    if (!m.voter) notes.push("not a voter");
    if (m.fenced) notes.push(`fenced (promised epoch ${m.promised_epoch})`);
    if (m.never_promote) notes.push("never-promote");
    if (m.priority) notes.push(`priority ${m.priority}`);
    if (m.following) notes.push(`follows ${m.following}`);
    if (present(m.master_frame_age_ms)) notes.push(`last frame ${millis(m.master_frame_age_ms)} ago`);
    return notes.join("; ");
  }

  function memberRow(g, m) {
    const isMaster = present(g.master) && m.name === g.master;
    const role = m.role || (m.live ? "?" : "—");
    return el("tr", {
      "data-member": m.name,
      "data-role": m.role || "",
      "data-live": String(Boolean(m.live)),
      class: [isMaster ? "master" : "", m.live ? "" : "dead"].join(" ").trim(),
    },
    el("td", { class: "name" }, m.name),
    el("td", { class: `role role-${m.role || "none"}` }, role),
    el("td", { class: "num" }, present(m.epoch) ? m.epoch : "—"),
    el("td", { class: "num", title: present(m.max_offset) ? `${m.max_offset} bytes` : null }, count(m.max_offset)),
    el("td", { class: "num" }, count(m.readable_end)),
    el("td", { class: "num", title: present(m.lag_bytes) ? `${m.lag_bytes} bytes` : null }, bytes(m.lag_bytes)),
    el("td", { class: "num" }, millis(m.lag_ms)),
    el("td", {}, yesNo(m.in_sync, true)),
    el("td", { class: "num" }, millis(m.lease_age_ms)));
  }

  // A member's row, and a row of notes under it when it has any.
  function memberRows(g, m) {
    const rows = [memberRow(g, m)];
    const notes = memberNotes(m);
    if (notes) {
      rows.push(el("tr", { class: "member-notes" }, el("td", {}),
        el("td", { colspan: MEMBER_COLUMNS.length - 1 }, notes)));
    }
    return rows;
  }

  function membersTable(g) {
    const members = [...(g.members || [])].sort((a, b) => {
      const am = a.name === g.master ? 0 : 1;
      const bm = b.name === g.master ? 0 : 1;
      return am - bm || String(a.name).localeCompare(String(b.name));
    });
    const table = el("table", { class: "members" },
      el("thead", {}, el("tr", {}, ...MEMBER_COLUMNS.map(([h, t]) => el("th", { title: t }, h)))),
      el("tbody", {}, ...members.flatMap((m) => memberRows(g, m))));
    return el("div", { class: "table-wrap" }, table);
  }

  function decisionItem(d) {
    const moved = `${d.old_master || "none"} → ${d.new_master || "none"}`;
    const lines = [
      el("div", { class: "decision-head" },
        el("span", { class: "kind" }, d.kind || "?"),
        ` epoch ${present(d.epoch) ? d.epoch : "?"} · ${moved} · ${clock(d.time_unix_ms)}`,
        d.controller ? ` · by ${d.controller}` : ""),
    ];
    if (d.rule) lines.push(el("div", {}, "rule: ", d.rule));
    if (d.fencing) lines.push(el("div", {}, "fencing: ", d.fencing));
    if (d.blocked_reason) lines.push(el("div", { class: "bad" }, "blocked: ", blockedText(d.blocked_reason)));
    if (present(d.loss_bound_bytes)) lines.push(el("div", {}, `loss bound: ${bytes(d.loss_bound_bytes)}`));
    return el("li", { "data-decision-epoch": present(d.epoch) ? d.epoch : "", "data-kind": d.kind || "" }, ...lines);
  }

  function decisions(g) {
    const list = g.recent_decisions || [];
    if (list.length === 0) return el("p", { class: "muted" }, "No decisions recorded.");
    const sorted = [...list].sort((a, b) => (b.time_unix_ms || 0) - (a.time_unix_ms || 0));
    return el("ol", { class: "decisions" }, ...sorted.map(decisionItem));
  }

  function groupCard(g) {
    const mode = g.mode ? g.mode.toUpperCase() : "mode ?";
    const head = el("header", {},
      el("h2", {}, g.group),
      g.bootstrapped ? el("span", { class: "badge" }, `epoch ${g.epoch}`) : null,
      g.phase ? el("span", { class: `badge phase-${g.phase}` }, g.phase) : null,
      g.bootstrapped ? el("span", { class: "badge" }, `${mode} k=${g.k}`) : null,
      g.paused ? el("span", { class: "badge warn" }, "paused") : null);
    const facts = el("dl", { class: "facts" });
    if (!g.bootstrapped) {
      facts.append(fact("state", "not bootstrapped (no state record yet)"));
    } else {
      facts.append(fact("master", el("strong", { "data-master-name": "" }, g.master || "none")));
      const voters = g.voters || [];
      facts.append(fact("voters", `${voters.join(", ") || "none"} (|V| = ${voters.length}, k = ${g.k})`));
    }
    facts.append(failoverFact(g));
    const leader = present(g.leader) ? `${g.leader} (epoch ${g.leader_epoch})` : "nobody holds it";
    facts.append(fact("leader key", leader));
    facts.append(fact("confirm offset", count(g.confirm_offset)));
    if (present(g.chosen)) facts.append(fact("chosen", g.chosen));
    if (present(g.pending_request)) {
      const r = g.pending_request;
      const to = r.to || "the controller's pick";
      facts.append(fact("pending", `request ${r.id} (${r.kind} to ${to}, ${ago(r.time_unix_ms)})`));
    }
    if (g.last_decision) {
      const by = g.last_controller ? ` (controller ${g.last_controller})` : "";
      facts.append(fact("last decision", `${g.last_decision}${by}`));
    }
    return el("section", {
      class: `group ${g.failover_possible ? "" : "blocked"}`.trim(),
      "data-group": g.group,
      "data-master": g.master || "",
      "data-epoch": present(g.epoch) ? g.epoch : "",
      "data-phase": g.phase || "",
      "data-failover": g.failover_possible ? "possible" : "blocked",
    },
    head,
    facts,
    el("h3", {}, "members"),
    membersTable(g),
    el("h3", {}, "recent decisions"),
    decisions(g));
  }

  // ---- the page ---------------------------------------------------------------------------

  function show(id, text) {
    const b = $(id);
    if (present(text)) {
      b.textContent = text;
      b.hidden = false;
    } else {
      b.hidden = true;
    }
  }

  function renderBanners() {
    const doc = state.doc;
    if (doc && doc.connected === false) {
      const since = state.lastConnectedMs || doc.time_unix_ms;
      const why = doc.coordinator_error ? ` Error: ${doc.coordinator_error}` : "";
      show("banner-stale",
        `This node lost etcd: the view may be stale since ${clock(since)} (${ago(since)}).${why}`);
    } else {
      show("banner-stale", null);
    }
    const stream = {
      live: null,
      connecting: null,
      reconnecting: "The event stream dropped: reconnecting… (the view below is from " +
        `${clock(doc && doc.time_unix_ms)})`,
      refused: `The node refused the event stream (too many viewers?); trying again in ${REFUSED_RETRY_MS / 1000} s.`,
    }[state.stream];
    show("banner-stream", stream);
    $("banner-uncoordinated").hidden = !(doc && doc.coordinated === false);
    $("banner-paused").hidden = !(doc && doc.paused);
  }

  function renderSummary() {
    const doc = state.doc;
    $("stream").textContent = state.stream;
    $("stream").dataset.state = state.stream;
    if (!doc) return;
    $("node").textContent = doc.node || "—";
    $("cluster").textContent = doc.cluster || "—";
    $("controller").textContent = doc.controller || "none";
    $("revision").textContent = present(doc.revision) ? String(doc.revision) : "—";
    $("updated").textContent = `${clock(doc.time_unix_ms)} (${ago(doc.time_unix_ms)})`;
  }

  function renderGroups() {
    const doc = state.doc;
    const groups = [...(doc.groups || [])].sort((a, b) => String(a.group).localeCompare(String(b.group)));
    const cards = groups.map(groupCard);
    if (cards.length === 0) cards.push(el("p", { class: "empty" }, "No groups."));
    $("groups").replaceChildren(...cards);
  }

  function render() {
    document.body.dataset.stream = state.stream;
    document.body.dataset.updates = String(state.updates);
    document.body.dataset.connected = state.doc ? String(state.doc.connected !== false) : "";
    renderSummary();
    renderBanners();
  }

  function onTopology(ev) {
    let doc;
    try {
      doc = JSON.parse(ev.data);
    } catch (e) {
      show("banner-error", `The node sent a document that is not JSON: ${e.message}`);
      return;
    }
    show("banner-error", null);
    state.doc = doc;
    state.updates += 1;
    if (doc.connected !== false) state.lastConnectedMs = doc.time_unix_ms;
    renderGroups();
    render();
  }

  function connect() {
    const source = new EventSource(EVENTS);
    state.source = source;
    source.addEventListener("topology", onTopology);
    source.addEventListener("open", () => {
      state.stream = "live";
      render();
    });
    source.addEventListener("error", () => {
      if (source.readyState === EventSource.CLOSED) {
        state.stream = "refused";
        setTimeout(connect, REFUSED_RETRY_MS);
      } else {
        // The browser reconnects by itself.
        state.stream = "reconnecting";
      }
      render();
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    connect();
    render();
    // The ages ("3 s ago") move on between documents.
    setInterval(render, 1000);
  });
})();
