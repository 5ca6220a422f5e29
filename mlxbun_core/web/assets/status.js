// The status page: the served model, /stats, /fit (where the server has it) and /v1/models.
import { getJSON } from "./api.js";

function table(rows) {
  const t = document.createElement("table");
  t.className = "kv";
  for (const [key, value] of rows) {
    const tr = t.insertRow();
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = key;
    const td = tr.insertCell();
    td.textContent = value === null || value === undefined ? "—" : String(value);
    tr.prepend(th);
  }
  return t;
}

function raw(obj) {
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = "JSON";
  const pre = document.createElement("pre");
  pre.textContent = JSON.stringify(obj, null, 2);
  details.append(summary, pre);
  return details;
}

const mib = (bytes) => (bytes === undefined || bytes === null ? null : `${(bytes / 1048576).toFixed(1)} MiB`);

export class StatusView {
  constructor() {
    this.timer = 0;
    document.getElementById("status-refresh").addEventListener("click", () => this.refresh());
  }

  show(visible) {
    clearInterval(this.timer);
    if (!visible) return;
    this.refresh();
    this.timer = setInterval(() => this.refresh(), 5000);
  }

  async refresh() {
    const [models, stats, index] = await Promise.all([
      getJSON("/v1/models"), getJSON("/stats"), getJSON("/v1")]);
    // /fit only where the server lists it (asking blindly would log a 404 in the console)
    const hasFit = (index.body?.endpoints || []).some((e) => /\/fit\b/.test(e));
    const fit = hasFit ? await getJSON("/fit") : { ok: false, status: 404 };
    this.model(models);
    this.stats(stats);
    this.fit(fit);
    this.models(models);
  }

  failed(r) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = r.status === 404 ? "Not available on this server." : `HTTP ${r.status}`;
    return p;
  }

  model(r) {
    const box = document.getElementById("status-model");
    const m = r.ok ? r.body.data[0] : null;
    if (!m) return box.replaceChildren(this.failed(r));
    const caps = Object.entries(m.capabilities || {}).filter(([, on]) => on).map(([k]) => k);
    box.replaceChildren(table([
      ["id", m.id], ["family", m.family], ["plugin", m.plugin], ["context window", m.context_window],
      ["reasoning", m.reasoning ? "yes" : "no"], ["vision", m.vision ? "yes" : "no"],
      ["batching", m.batch_mode], ["capabilities", caps.join(", ")]]));
  }

  stats(r) {
    const box = document.getElementById("status-stats");
    if (!r.ok) return box.replaceChildren(this.failed(r));
    const s = r.body;
    const pc = s.prompt_cache || {};
    box.replaceChildren(table([
      ["requests", `${s.requests.completed} done · ${s.requests.active} active · ${s.requests.waiting} waiting`],
      ["batch", `${s.batch.active_rows}/${s.batch.cap} rows`],
      ["prompt cache", pc.enabled ? `${mib(pc.bytes)} of ${mib(pc.max_bytes)} · ${pc.hits ?? 0} hits` : "off"],
      ["started", new Date(s.server.started_at * 1000).toLocaleString()],
      ["plugins", (s.plugins || []).join(", ")]]), raw(s));
  }

  fit(r) {
    const box = document.getElementById("status-fit");
    if (!r.ok) return box.replaceChildren(this.failed(r));
    const f = r.body;
    const rep = f.report || {};
    const m = f.machine || {};
    box.replaceChildren(table([
      ["verdict", rep.fits === undefined ? null : rep.fits ? "fits" : "does NOT fit"],
      ["machine", [m.chip, m.device].filter(Boolean).join(" · ") || null],
      ["usable memory", mib(rep.usable_bytes ?? m.usable_bytes)],
      ["weights", mib(rep.weights_bytes)],
      ["KV per token", rep.kv_bytes_per_token === undefined ? null : `${rep.kv_bytes_per_token} B`],
      [`total at ${f.context_tokens ?? "?"} tokens`, mib(rep.total_bytes)],
      ["max safe context", rep.max_safe_context],
      ["predicted decode", rep.predicted_decode_tps === undefined ? null : `${rep.predicted_decode_tps} tok/s`]]),
    raw(f));
  }

  models(r) {
    const box = document.getElementById("status-models");
    if (!r.ok) return box.replaceChildren(this.failed(r));
    const t = document.createElement("table");
    t.className = "grid stack"; // a phone: a block per model, each value labelled
    const head = t.createTHead().insertRow();
    const columns = ["id", "family", "plugin", "context", "state"];
    for (const h of columns) {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = h;
      head.append(th);
    }
    const body = t.createTBody();
    r.body.data.forEach((row, i) => {
      const tr = body.insertRow();
      const state = i === 0 ? "serving" : "on disk";
      [row.id, row.family, row.plugin, row.context_window, state].forEach((v, c) => {
        const td = tr.insertCell();
        td.textContent = v === null || v === undefined ? "—" : String(v);
        if (c) td.dataset.label = columns[c];
      });
    });
    box.replaceChildren(t, raw(r.body));
  }
}
