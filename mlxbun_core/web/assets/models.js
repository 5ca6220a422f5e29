// The Models page: search the hub for MLX-ready models, download them (progress from
// GET /downloads, cancel), and serve or delete what is on this machine.
import { getJSON, sendJSON } from "./api.js";

const $ = (id) => document.getElementById(id);

const send = sendJSON;

const size = (bytes) => {
  if (!bytes) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let n = bytes;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
};

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props);
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function button(label, onClick, cls = "") {
  const b = el("button", { type: "button", textContent: label, className: cls });
  b.addEventListener("click", onClick);
  return b;
}

// The server's reason starts "offline: …" and may already say that cached models still
// work: one "Offline:" and the hint once.
function offlineNote(error) {
  const reason = (error || "the hub cannot be reached").replace(/^offline:\s*/i, "").replace(/\.$/, "");
  return `Offline: ${reason}.${/still work/i.test(reason) ? "" : " Downloaded models still work."}`;
}

export class ModelsView {
  constructor() {
    this.timer = 0;
    this.visible = false;
    this.active = new Set(); // repos downloading, so their Download buttons stay off
    $("hub-search-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.search();
    });
    $("models-refresh").addEventListener("click", () => this.refresh(true));
  }

  show(visible) {
    this.visible = visible;
    clearTimeout(this.timer);
    if (visible) this.refresh(true);
  }

  note(text, isError = false) {
    const box = $("models-note");
    box.textContent = text;
    box.dataset.error = isError ? "1" : "";
    box.hidden = !text;
  }

  async refresh(withLocal = false) {
    clearTimeout(this.timer);
    const downloads = await getJSON("/downloads");
    const rows = downloads.ok ? downloads.body.downloads : [];
    const before = this.active;
    const wasActive = before.size;
    this.active = new Set(rows.filter((d) => d.state === "active").map((d) => d.repo_id));
    for (const d of rows) {
      if (before.has(d.repo_id) && d.state === "done") this.note(`Downloaded ${d.repo_id}.`);
    }
    this.renderDownloads(rows);
    if (withLocal || (wasActive && this.active.size < wasActive)) await this.local();
    if (this.visible) this.timer = setTimeout(() => this.refresh(), this.active.size ? 700 : 4000);
  }

  async search() {
    const q = $("hub-search-input").value.trim();
    const box = $("hub-results");
    if (!q) return;
    box.replaceChildren(el("p", { className: "muted", textContent: "Searching…" }));
    const r = await getJSON(`/api/hub/search?q=${encodeURIComponent(q)}`);
    if (!r.ok) return box.replaceChildren(el("p", { className: "muted", textContent: r.body?.error || `HTTP ${r.status}` }));
    if (r.body.offline) return box.replaceChildren(el("p", { className: "offline", textContent: offlineNote(r.body.error) }));
    if (!r.body.results.length) return box.replaceChildren(el("p", { className: "muted", textContent: "No MLX-ready models match." }));
    const list = el("ul", { className: "hub-results" });
    for (const m of r.body.results) {
      const get = button("Download", () => this.download(m.id, get), "primary");
      get.disabled = this.active.has(m.id);
      list.append(el("li", { className: "hub-result" },
        el("span", { className: "hub-id", textContent: m.id }),
        el("span", { className: "muted", textContent: `${m.downloads.toLocaleString()} downloads · ${m.likes} likes${m.gated ? " · gated" : ""}` }),
        get));
      list.lastElementChild.dataset.repo = m.id;
    }
    box.replaceChildren(list);
  }

  async download(repo, btn) {
    btn.disabled = true;
    const r = await send("POST", "/api/hub/download", { repo });
    if (!r.ok) {
      this.note(r.body?.error || `HTTP ${r.status}`, true);
      if (r.status !== 409) btn.disabled = false;
      return;
    }
    this.note(`Downloading ${repo}…`);
    this.refresh();
  }

  renderDownloads(rows) {
    const box = $("hub-downloads");
    if (!rows.length) return box.replaceChildren(el("p", { className: "muted", textContent: "No downloads yet." }));
    const list = el("ul", { className: "downloads" });
    for (const d of rows) {
      const pct = d.total_bytes ? d.received_bytes / d.total_bytes : d.state === "done" ? 1 : 0;
      const bar = el("progress", { max: 1, value: pct });
      bar.setAttribute("aria-label", `${d.repo_id} download progress`);
      const detail = d.state === "active"
        ? `${size(d.received_bytes)} of ${size(d.total_bytes)} · ${size(d.bytes_per_sec)}/s · ${d.files_done}/${d.files_total} files`
        : d.state === "error" ? d.error : "done";
      const item = el("li", { className: `download ${d.state}` },
        el("span", { className: "hub-id", textContent: d.repo_id }), bar,
        el("span", { className: "download-detail", textContent: detail }),
        d.state === "active" ? button("Cancel", () => this.cancel(d.job_id)) : this.dismissButton(d));
      item.dataset.state = d.state;
      item.dataset.repo = d.repo_id;
      item.dataset.job = d.job_id;
      list.append(item);
    }
    box.replaceChildren(list);
  }

  // A finished download leaves the list for good: the server forgets it too.
  dismissButton(d) {
    const b = button("Dismiss", async () => {
      b.disabled = true;
      const r = await send("DELETE", `/api/hub/downloads/${encodeURIComponent(d.job_id)}`);
      if (!r.ok && r.status !== 404) this.note(r.body?.error || `HTTP ${r.status}`, true);
      this.refresh();
    }, "link-btn");
    b.setAttribute("aria-label", `Dismiss the ${d.state === "error" ? "failed " : ""}download of ${d.repo_id}`);
    return b;
  }

  async cancel(jobId) {
    const r = await send("POST", `/api/jobs/${encodeURIComponent(jobId)}/cancel`);
    if (!r.ok) this.note(r.body?.error || `HTTP ${r.status}`, true);
    this.refresh();
  }

  async local() {
    const box = $("hub-local");
    const r = await getJSON("/api/hub/local?refresh=1");
    if (!r.ok) return box.replaceChildren(el("p", { className: "muted", textContent: r.body?.error || `HTTP ${r.status}` }));
    if (!r.body.models.length) return box.replaceChildren(el("p", { className: "muted", textContent: "No models on this machine yet." }));
    const t = el("table", { className: "grid stack" });
    const head = t.createTHead().insertRow();
    for (const h of ["model", "size", "precision", "fits", ""]) head.append(el("th", { scope: "col", textContent: h }));
    const body = t.createTBody();
    for (const m of r.body.models) {
      const tr = body.insertRow();
      tr.dataset.repo = m.repo_id;
      const fits = m.assessment ? (m.assessment.fits ? "yes" : "no") : "—";
      const cells = [[null, m.repo_id + (m.serving ? " (serving)" : "")], ["size", size(m.size_bytes)],
        ["precision", m.precision || "—"], ["fits", fits]];
      for (const [label, v] of cells) {
        const td = tr.insertCell();
        td.textContent = v;
        if (label) td.dataset.label = label; // shown on a phone, where the header is not
      }
      const actions = tr.insertCell();
      actions.className = "actions";
      if (!m.serving) {
        actions.append(button("Serve", () => this.serve(m.repo_id)),
          button("Delete", () => this.remove(m.repo_id), "danger"));
      }
    }
    box.replaceChildren(t);
  }

  async serve(repo) {
    const r = await send("POST", "/api/hub/serve", { model: repo });
    if (r.body?.restart_required) this.note(`This server serves one model. To serve ${repo}, restart it: ${r.body.command}`);
    else if (r.ok && r.body?.ok) this.note(`${repo} is ${r.body.serving ? "being served" : "loading"}.`);
    else this.note(r.body?.error || `HTTP ${r.status}`, true);
  }

  async remove(repo) {
    if (!window.confirm(`Delete ${repo} from this machine?`)) return;
    const r = await send("POST", "/api/hub/delete", { repo });
    if (!r.ok) return this.note(r.body?.error || `HTTP ${r.status}`, true);
    this.note(`Deleted ${repo}.`);
    this.local();
  }
}
