// What the lab pages share: DOM helpers, JSON calls with the API key, a job's event
// stream (SSE read through fetch, so the key travels as a header), the job panel
// (progress, stage, cancel) and the model picker (the local library, a path, the hub).
import { apiKey, getJSON, postJSON } from "./api.js";

export { getJSON, postJSON };

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("aria-") || k === "role" || k === "for") node.setAttribute(k, v);
    else node[k] = v;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

export function button(label, onClick, cls = "") {
  const b = el("button", { type: "button", textContent: label, className: cls });
  b.addEventListener("click", onClick);
  return b;
}

// A labelled control: <label>Text <input …></label> plus an optional hint.
export function field(label, control, hint) {
  return el("label", { className: "lab-field" }, el("span", { textContent: label }), control,
    hint ? el("small", { className: "muted", textContent: hint }) : null);
}

export function select(name, options, value) {
  const s = el("select", { name });
  for (const o of options) {
    const [v, text] = Array.isArray(o) ? o : [o, String(o)];
    s.append(el("option", { value: String(v), textContent: text, selected: String(v) === String(value) }));
  }
  return s;
}


export const errorOf = (r) => r.body?.error?.message || r.body?.error || `HTTP ${r.status}`;

export const size = (bytes) => {
  if (!bytes && bytes !== 0) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let n = bytes;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
};

// Follow GET /api/jobs/<id>/stream: onEvent(event) per JobEvent, from the first (the
// stream replays the history) to done/failed. Returns a function that stops reading.
export function followJob(jobId, onEvent) {
  const ctrl = new AbortController();
  (async () => {
    const headers = apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
    const response = await fetch(`/api/jobs/${encodeURIComponent(jobId)}/stream`, { headers, signal: ctrl.signal });
    if (!response.ok || !response.body) {
      onEvent({ type: "failed", error: `the job stream answered HTTP ${response.status}` });
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (/^event: end/m.test(frame)) return;
        const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (data) {
          try { onEvent(JSON.parse(data)); } catch { /* a partial frame never reaches here */ }
        }
      }
    }
  })().catch((err) => {
    if (err.name !== "AbortError") onEvent({ type: "failed", error: `the job stream broke: ${err.message}` });
  });
  return () => ctrl.abort();
}

// The running job's card: status line, progress bar, the last stage message, Cancel.
// `onEvent` sees every event too (the fine-tune page draws its chart from them).
export class JobPanel {
  constructor(label, { onEvent = () => {}, onDone = () => {} } = {}) {
    this.onEvent = onEvent;
    this.onDone = onDone;
    this.stop = null;
    this.status = el("p", { className: "job-status", role: "status" });
    this.bar = el("progress", { max: 1, value: 0, "aria-label": `${label} progress` });
    this.message = el("p", { className: "job-message muted" });
    this.cancelBtn = button("Cancel", () => this.cancel(), "danger");
    this.result = el("div", { className: "job-result" });
    this.root = el("div", { className: "job-panel", hidden: true }, this.status,
      el("div", { className: "job-bar" }, this.bar, this.cancelBtn), this.message, this.result);
  }

  watch(jobId) {
    if (this.stop) this.stop();
    this.jobId = jobId;
    this.root.hidden = false;
    this.root.dataset.state = "queued";
    this.root.dataset.job = jobId;
    this.status.textContent = `Job ${jobId}: queued`;
    this.bar.value = 0;
    this.message.textContent = "";
    this.result.replaceChildren();
    this.cancelBtn.hidden = false;
    this.cancelBtn.disabled = false;
    this.stop = followJob(jobId, (e) => this.event(e));
  }

  event(e) {
    if (e.type === "started") this.state("running");
    if (typeof e.progress === "number") this.bar.value = e.progress;
    if (e.type === "stage") this.message.textContent = e.message || e.stage;
    if (e.type === "done") {
      this.bar.value = 1;
      this.state("done");
    }
    if (e.type === "failed") {
      this.state("failed", e.error);
      this.message.textContent = e.error || "failed";
    }
    this.onEvent(e);
    if (e.type === "done" || e.type === "failed") this.onDone(e);
  }

  state(state, why) {
    this.root.dataset.state = state;
    this.status.textContent = `Job ${this.jobId}: ${state}${why ? ` — ${why}` : ""}`;
    if (state === "done" || state === "failed") this.cancelBtn.hidden = true;
  }

  async cancel() {
    this.cancelBtn.disabled = true;
    const r = await postJSON(`/api/jobs/${encodeURIComponent(this.jobId)}/cancel`);
    if (!r.ok) {
      this.message.textContent = errorOf(r);
      this.cancelBtn.disabled = false;
    }
  }
}

// The model to work on: a model of the local library, or a path typed in; a hub search
// downloads one into the library. value() is {model_id} or {model_dir}.
export class ModelPicker {
  constructor(prefix, { onChange = () => {} } = {}) {
    this.onChange = onChange;
    this.list = el("select", { id: `${prefix}-model`, name: "model" });
    this.path = el("input", { id: `${prefix}-model-path`, type: "text", placeholder: "/path/to/model (optional)", autocomplete: "off", spellcheck: false });
    this.query = el("input", { id: `${prefix}-hub-q`, type: "search", placeholder: "e.g. qwen 0.5b", autocomplete: "off" });
    this.hubResults = el("div", { className: "hub-mini", "aria-live": "polite" });
    this.note = el("p", { className: "muted", role: "status" });
    const go = button("Search", () => this.search());
    this.query.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter") { ev.preventDefault(); this.search(); }
    });
    for (const c of [this.list, this.path]) c.addEventListener("change", () => this.onChange());
    this.root = el("div", { className: "model-picker" },
      field("Model from your library", this.list),
      field("…or a model folder on this machine", this.path, "a path wins over the list"),
      el("details", { className: "hub-find" }, el("summary", { textContent: "Not there? Find it on the hub" }),
        el("div", { className: "row" }, field("Search the hub", this.query), go), this.hubResults),
      this.note);
  }

  async load(filter = () => true) {
    const r = await getJSON("/api/hub/local").catch(() => null);
    const models = r?.ok ? r.body.models.filter(filter) : [];
    const keep = this.list.value;
    this.list.replaceChildren(...(models.length ? [] : [el("option", { value: "", textContent: "no models in the library" })]),
      ...models.map((m) => el("option", { value: m.repo_id, textContent: `${m.repo_id} · ${m.precision || "?"} · ${size(m.size_bytes)}${m.serving ? " · serving" : ""}` })));
    if (keep && models.some((m) => m.repo_id === keep)) this.list.value = keep;
    return models;
  }

  value() {
    const path = this.path.value.trim();
    if (path) return { model_dir: path, label: path };
    return this.list.value ? { model_id: this.list.value, label: this.list.value } : null;
  }

  async search() {
    const q = this.query.value.trim();
    if (!q) return;
    this.hubResults.textContent = "Searching…";
    const r = await getJSON(`/api/hub/search?q=${encodeURIComponent(q)}&limit=8`);
    if (!r.ok || r.body.offline) {
      this.hubResults.textContent = r.ok ? `Offline: ${r.body.error || "the hub cannot be reached"}.` : errorOf(r);
      return;
    }
    if (!r.body.results.length) {
      this.hubResults.textContent = "No MLX-ready models match.";
      return;
    }
    this.hubResults.replaceChildren(el("ul", { className: "plain" }, ...r.body.results.map((m) =>
      el("li", {}, el("span", { className: "hub-id", textContent: m.id }), " ",
        button("Download", (ev) => this.download(m.id, ev.target))))));
  }

  async download(repo, btn) {
    btn.disabled = true;
    const r = await postJSON("/api/hub/download", { repo });
    if (!r.ok) {
      this.note.textContent = errorOf(r);
      btn.disabled = false;
      return;
    }
    this.note.textContent = `Downloading ${repo}… it joins the list when it is done (progress on the Models page).`;
    const poll = async () => {
      const models = await this.load();
      if (models.some((m) => m.repo_id === repo)) {
        this.list.value = repo;
        this.note.textContent = `${repo} is in your library.`;
        this.onChange();
      } else if (this.root.isConnected) setTimeout(poll, 2000);
    };
    setTimeout(poll, 1000);
  }
}

// Recent jobs of one kind, each with an Open button that shows it in the page's panel.
export async function recentJobs(list, kind, open) {
  const r = await getJSON(`/api/jobs?limit=8&kind=${kind}`).catch(() => null);
  const jobs = r?.ok ? r.body.jobs || [] : null;
  if (jobs === null) return list.replaceChildren(el("li", { textContent: "The job list is not available here." }));
  if (!jobs.length) return list.replaceChildren(el("li", { className: "muted", textContent: "No jobs yet." }));
  list.replaceChildren(...jobs.map((j) => el("li", { dataset: { status: j.status } },
    el("span", { className: "job-id", textContent: j.id }),
    el("span", { className: `job-state ${j.status}`, textContent: j.status }),
    el("span", { className: "muted job-msg", textContent: j.error || j.message || "" }),
    button("Open", () => open(j.id), "small"))));
}

// The pages' sub-navigation (Quantize · Fine-tune · Dataset).
export function labNav(current) {
  const nav = el("nav", { className: "lab-nav", "aria-label": "Lab pages" });
  for (const [route, title] of [["quantize", "Quantize"], ["finetune", "Fine-tune"], ["dataset", "Dataset"]]) {
    const a = el("a", { href: `#${route}`, textContent: title });
    if (route === current) a.setAttribute("aria-current", "page");
    nav.append(a);
  }
  return nav;
}

// Hand-offs between the pages (the dataset page's "Fine-tune on this").
export const handoff = { dataset: null };
