"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const STALE_MS = 3500;
  let lastAt = 0, status = null, es = null, pollTimer = null;
  // The live view's URL on this host (wss when the page came over HTTPS).
  $("live-url").textContent = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/foxglove";
  const sourceCards = new Map();

  function fmtBytes(n) {
    if (n == null) return "–";
    if (n < 1024) return Math.round(n) + " B";
    const u = ["KiB", "MiB", "GiB", "TiB"];
    let v = n / 1024, i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return v.toFixed(1) + " " + u[i];
  }
  function fmtDur(ms) {
    if (ms == null) return "–";
    const s = Math.floor(ms / 1000);
    if (s < 1) return Math.round(ms) + " ms";
    if (s < 120) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
  }
  function fmtNs(ns) {
    if (ns == null) return "–";
    const a = Math.abs(ns);
    if (a < 1e3) return ns + " ns";
    if (a < 1e6) return (ns / 1e3).toFixed(1) + " µs";
    return (ns / 1e6).toFixed(2) + " ms";
  }
  function fmtRate(r, unit) {
    if (r == null) return "–";
    return (r >= 100 ? r.toFixed(0) : r.toFixed(1)) + " " + unit;
  }
  function fmtMs(ms) {
    if (ms == null) return "–";
    return ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(ms < 10 ? 1 : 0) + " ms";
  }
  function setText(id, text) { const el = typeof id === "string" ? $(id) : id; if (el.textContent !== text) el.textContent = text; }
  function setBadge(el, text, cls) { setText(el, text); el.className = "badge " + cls; }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function renderClock(c) {
    const cls = { locked: "ok", locking: "warn", holdover: "warn", unsynced: c.port_state ? "bad" : "idle" }[c.state] || "idle";
    setBadge($("clock-state"), (c.state || "?").toUpperCase(), cls);
    setText("clock-offset", fmtNs(c.offset_ns));
    setText("clock-delay", fmtNs(c.path_delay_ns));
    setText("clock-master", c.master || (c.port_state ? "none heard" : "no PTP configured"));
    setText("clock-locked", c.locked_for_s != null ? fmtDur(c.locked_for_s * 1000)
      : c.holdover_s != null ? "holdover " + fmtDur(c.holdover_s * 1000) : "–");
    setText("clock-port", c.port_state || "off");
    setText("clock-steps", String(c.steps));
  }

  function renderUplink(u) {
    let text, cls;
    if (!u.configured) { text = "NO BROKER"; cls = "idle"; }
    else if (u.paused) { text = "PAUSED"; cls = "warn"; }
    else if (u.connected) { text = "CONNECTED"; cls = "ok"; }
    else { text = "UNREACHABLE"; cls = "bad"; }
    setBadge($("uplink-state"), text, cls);
    setText("uplink-broker", u.broker || "none (everything spools)");
    setText("uplink-latency", u.latency_p50_ms == null ? "–" : fmtMs(u.latency_p50_ms) + " / " + fmtMs(u.latency_p99_ms));
    setText("uplink-inflight", String(u.in_flight));
    setText("uplink-published", String(u.published) + (u.refused ? " (" + u.refused + " refused)" : ""));
    setText("uplink-rate", fmtRate(u.publish_rate, "msg/s"));
    setText("uplink-budget", u.budget_bytes_per_second == null ? "unlimited"
      : fmtBytes(u.wire_rate || 0) + "/s of " + fmtBytes(u.budget_bytes_per_second) + "/s");
    setText("uplink-error", u.last_error || "–");
  }

  function renderSpool(s) {
    const full = s.max_bytes ? s.bytes / s.max_bytes : 0;
    setBadge($("spool-state"), s.records ? (s.drain_eta_s != null ? "DRAINING" : "HOLDING") : "EMPTY",
      full > 0.9 || s.dropped ? "bad" : s.records ? "warn" : "ok");
    setText("spool-bytes", fmtBytes(s.bytes) + (s.max_bytes ? " of " + fmtBytes(s.max_bytes) : ""));
    const fill = $("spool-fill");
    fill.style.width = Math.min(100, full * 100).toFixed(1) + "%";
    fill.style.background = full > 0.9 ? "var(--bad)" : full > 0.6 ? "var(--warn)" : "var(--ok)";
    setText("spool-records", String(s.records));
    setText("spool-oldest", s.oldest_age_ms == null ? "–" : fmtDur(s.oldest_age_ms) + " ago");
    setText("spool-rates", fmtRate(s.push_rate, "/s") + " in, " + fmtRate(s.pop_rate, "/s") + " out");
    setText("spool-eta", s.drain_eta_s == null ? (s.records ? "not draining" : "–") : fmtDur(s.drain_eta_s * 1000));
    setText("spool-dropped", String(s.dropped));
    setText("spool-quarantined", String(s.quarantined));
  }

  function renderRecall(r) {
    setBadge($("recall-state"), r.connected ? "CONNECTED" : "OFFLINE", r.connected ? "ok" : "warn");
    setText("recall-topic", r.control_topic);
    setText("recall-pending", String(r.pending));
    setText("recall-sent", r.frames_sent.toLocaleString("en-US") + " frames (" + fmtBytes(r.bytes_sent) + ")");
    const reasons = Object.entries(r.rejected_by_reason || {}).map(([k, n]) => n + " " + k).join(", ");
    setText("recall-rejected", String(r.rejected) + (reasons ? " (" + reasons + ")" : ""));
    setText("recall-error", r.last_error || "–");
  }

  function makeSourceCard(src) {
    const card = el("section", "card source");
    card.dataset.source = src.id;
    card.id = "source-" + src.id;
    const h = el("h2");
    h.append(el("span", null, src.id), el("span", "kind", src.kind));
    const badge = el("span", "badge idle", "…");
    h.append(badge);
    const big = el("div", "big frames", "0");
    const dl = el("dl");
    const fields = {};
    for (const [key, label] of [["rate", "Rate"], ["age", "Last frame"], ["drops", "Drops"], ["spooled", "Spooled"], ["published", "Published"], ["share", "Uplink"]]) {
      dl.append(el("dt", null, label));
      fields[key] = el("dd", key);
      dl.append(fields[key]);
    }
    const detail = el("p", "detail");
    const reason = el("p", "reason");
    // A camera's proxy (`{id}-proxy`, kind "proxy") is a card of its own: each links the other.
    const proxyLink = el("a", "proxy-link");
    proxyLink.hidden = true;
    card.append(h, big, detail, proxyLink, dl, reason);
    const c = { card, badge, big, fields, detail, reason, proxyLink, modality: src.modality };
    if (src.modality === "camera") {
      const box = el("div", "thumb-box");
      const img = el("img", "thumb");
      img.alt = "latest frame of " + src.id;
      img.hidden = true;
      const none = el("span", "none", "no frame yet");
      box.append(img, none);
      card.append(box);
      c.img = img; c.none = none; c.loading = false; c.shownSeq = null;
      img.addEventListener("load", () => { c.loading = false; img.hidden = false; none.hidden = true; });
      img.addEventListener("error", () => { c.loading = false; });
    } else if (src.modality === "audio") {
      const meter = el("div", "meter");
      const cover = el("div", "cover"), peak = el("div", "peak");
      meter.append(cover, peak);
      const label = el("div", "meter-label");
      const l1 = el("span", null, "-60 dBFS"), l2 = el("span", "level", "–"), l3 = el("span", null, "0");
      label.append(l1, l2, l3);
      card.append(meter, label);
      c.cover = cover; c.peak = peak; c.level = l2;
    } else {
      c.records = el("pre", "records", "");
      card.append(c.records);
    }
    $("cards").append(card);
    return c;
  }

  function pct(db) { return Math.max(0, Math.min(100, (db + 60) / 60 * 100)); }

  function renderSource(src, kinds) {
    let c = sourceCards.get(src.id);
    if (!c) { c = makeSourceCard(src); sourceCards.set(src.id, c); }
    const other = src.kind === "proxy" ? src.id.replace(/-proxy$/, "") : src.id + "-proxy";
    const linked = src.modality === "camera" && kinds.has(other) && (src.kind === "proxy") !== (kinds.get(other) === "proxy");
    c.proxyLink.hidden = !linked;
    if (linked) {
      c.proxyLink.href = "#source-" + other;
      setText(c.proxyLink, src.kind === "proxy" ? "proxy of " + other + " (full resolution: recall)" : "live proxy: " + other);
    }
    const stalled = src.state === "running" && src.last_frame_age_ms != null && src.last_frame_age_ms > src.stall_after_ms;
    const cls = src.state !== "running" || stalled ? "bad" : src.drop_rate ? "warn" : "ok";
    setBadge(c.badge, stalled ? "STALLED" : src.state.toUpperCase(), cls);
    setText(c.big, src.frames.toLocaleString("en-US") + " frames");
    setText(c.fields.rate, fmtRate(src.frame_rate, "fps") + (src.byte_rate != null ? " · " + fmtBytes(src.byte_rate) + "/s" : ""));
    setText(c.fields.age, src.last_frame_age_ms == null ? "never" : fmtDur(src.last_frame_age_ms) + " ago");
    setText(c.fields.drops, String(src.drops));
    setText(c.fields.spooled, src.spooled_records + " (" + fmtBytes(src.spool_bytes) + ")"
      + (src.upload === "on-request" ? ", held on request" + (src.held_since_age_ms != null ? " from " + fmtDur(src.held_since_age_ms) + " ago" : "")
        + (src.retention_evicted ? ", " + src.retention_evicted + " evicted by retention" : "") : "")
      + (src.bandwidth_waiting ? ", waiting for bandwidth" + (src.backlog_eta_s != null ? ", ETA " + fmtDur(src.backlog_eta_s * 1000) : "") : ""));
    setText(c.fields.share, "priority " + src.priority + (src.uplink_rate != null ? " · " + fmtBytes(src.uplink_rate) + "/s" : ""));
    setText(c.fields.published, String(src.published));
    setText(c.reason, src.reason || "");
    setText(c.detail, src.detail || "");
    if (c.img && src.preview_seq != null && src.preview_seq !== c.shownSeq && !c.loading) {
      c.loading = true;
      c.shownSeq = src.preview_seq;
      c.img.src = "/api/sources/" + encodeURIComponent(src.id) + "/preview.jpg?seq=" + src.preview_seq;
    }
    if (c.cover) {
      if (src.audio) {
        c.cover.style.left = pct(src.audio.rms_dbfs) + "%";
        c.peak.style.left = "calc(" + pct(src.audio.peak_dbfs) + "% - 2px)";
        setText(c.level, src.audio.rms_dbfs.toFixed(1) + " dBFS rms");
      } else {
        c.cover.style.left = "0%";
        setText(c.level, "no level yet");
      }
    }
    if (c.records) setText(c.records, src.last_records.length ? src.last_records.join("\n") : "no records yet");
  }

  function renderAlerts(alerts) {
    const ul = $("alerts");
    const items = alerts.length ? alerts : [{ level: "ok", text: "All good: every source is delivering and nothing needs attention." }];
    const key = JSON.stringify(items);
    if (ul.dataset.key === key) return;
    ul.dataset.key = key;
    ul.replaceChildren(...items.map((a) => el("li", { error: "bad", warn: "warn", info: "info", ok: "ok" }[a.level], a.text)));
  }

  function render(s) {
    status = s;
    lastAt = Date.now();
    document.title = "rigd " + s.rig;
    setText("rig", s.rig);
    setText("version", "rigd " + s.version + " · up " + fmtDur(s.uptime_s * 1000));
    renderAlerts(s.alerts);
    renderClock(s.clock);
    renderUplink(s.uplink);
    renderSpool(s.spool);
    // Recall runs with a broker and an on-request source; without it a marker uploads nothing.
    $("recall-card").hidden = !s.recall;
    $("mark-upload").hidden = !s.recall;
    if (s.recall) renderRecall(s.recall);
    if (s.live) {
      $("live-view").hidden = s.live.max_clients === 0;
      setText("live-clients", "(" + s.live.clients + " of " + s.live.max_clients + " clients connected)");
    }
    const seen = new Set();
    const kinds = new Map(s.sources.map((x) => [x.id, x.kind]));
    for (const src of s.sources) { renderSource(src, kinds); seen.add(src.id); }
    for (const [id, c] of sourceCards) if (!seen.has(id)) { c.card.remove(); sourceCards.delete(id); }
    $("actions-disabled").hidden = s.control_enabled;
    const sel = $("spool-source");
    const ids = s.sources.map((x) => x.id).join(",");
    if (sel.dataset.ids !== ids) {
      sel.dataset.ids = ids;
      sel.replaceChildren(...s.sources.map((x) => { const o = el("option", null, x.id); o.value = x.id; return o; }));
    }
    tick();
  }

  function tick() {
    const age = lastAt ? Date.now() - lastAt : Infinity;
    const stale = age > STALE_MS;
    document.body.classList.toggle("stale", stale && lastAt > 0);
    const conn = $("conn");
    if (!lastAt) setBadge(conn, "CONNECTING", "idle");
    else if (stale) setBadge(conn, "STALE", "bad");
    else setBadge(conn, "LIVE", "ok");
    if (lastAt) {
      setText("stale-age", fmtDur(age) + " old");
      setText("updated", new Date(lastAt).toLocaleTimeString());
    }
  }

  async function poll() {
    try {
      const r = await fetch("/api/status", { cache: "no-store" });
      if (r.ok) render(await r.json());
    } catch (e) { /* stays stale */ }
  }

  function connect() {
    if (es) es.close();
    es = new EventSource("/api/stream");
    es.addEventListener("status", (e) => {
      try { render(JSON.parse(e.data)); } catch (err) { /* a bad frame: wait for the next */ }
      if (pollTimer) { clearInterval(pollTimer); pollTimer = null; }
    });
    es.onerror = () => {
      // The browser reconnects by itself unless the server refused (e.g. 503: too many clients);
      // then fall back to polling and try the stream again later.
      if (es.readyState === EventSource.CLOSED) {
        if (!pollTimer) pollTimer = setInterval(poll, 2000);
        setTimeout(connect, 10000);
      }
    };
  }

  async function act(method, path, body) {
    const out = $("action-result");
    const token = $("token").value.trim();
    try { localStorage.setItem("rigd-token", token); } catch (e) { /* private mode */ }
    out.textContent = "…";
    try {
      const r = await fetch(path, {
        method, cache: "no-store",
        headers: Object.assign({ "Content-Type": "application/json" }, token ? { Authorization: "Bearer " + token } : {}),
        body: body == null ? undefined : JSON.stringify(body),
      });
      const j = await r.json().catch(() => ({}));
      out.textContent = r.ok ? "Done: " + JSON.stringify(j) : "Refused (" + r.status + "): " + (j.error || r.statusText);
      out.className = r.ok ? "" : "reason";
      poll();
    } catch (e) {
      out.textContent = "Failed: " + e;
      out.className = "reason";
    }
  }

  $("pause").onclick = () => act("POST", "/api/uplink/pause");
  $("resume").onclick = () => act("POST", "/api/uplink/resume");
  $("mark").onclick = () => {
    const body = { note: $("note").value };
    if (status && status.recall && $("upload-on").checked) {
      body.upload = { before_s: Number($("upload-before").value), after_s: Number($("upload-after").value) };
    }
    act("POST", "/api/events", body);
    $("note").value = "";
  };
  $("clear").onclick = () => {
    const id = $("spool-source").value;
    if (!id) return;
    const src = status && status.sources.find((x) => x.id === id);
    const n = src ? src.spooled_records : "all";
    if (confirm("Drop " + n + " spooled frames of " + id + "? They will never be uploaded.")) {
      act("DELETE", "/api/spool/" + encodeURIComponent(id) + "?confirm=" + encodeURIComponent(id));
    }
  };
  try { $("token").value = localStorage.getItem("rigd-token") || ""; } catch (e) { /* private mode */ }

  setInterval(tick, 500);
  poll();
  connect();
})();
