// The Dataset page (#dataset): pick a dataset (one on this machine, a path, or a JSONL
// file uploaded from the browser), inspect it (POST /api/dataset/inspect: rows per split,
// fields, samples, token counts, problems by line), and hand it to the fine-tune page.
// The picker and the inspection view are shared with the fine-tune page.
import { button, el, errorOf, field, getJSON, handoff, labNav, postJSON, size } from "./lab_common.js";

// A dataset folder or file: the list under <home>/datasets, a typed path, or an upload.
export class DatasetPicker {
  constructor(prefix, { onChange = () => {} } = {}) {
    this.onChange = onChange;
    this.list = el("select", { id: `${prefix}-data`, name: "dataset" });
    this.path = el("input", { id: `${prefix}-data-path`, type: "text", placeholder: "/path/to/dataset or file.jsonl", autocomplete: "off", spellcheck: false });
    this.file = el("input", { id: `${prefix}-data-file`, type: "file", accept: ".jsonl,.json,application/jsonl,text/plain" });
    this.note = el("p", { className: "muted", role: "status" });
    for (const c of [this.list, this.path]) c.addEventListener("change", () => this.onChange());
    this.file.addEventListener("change", () => this.upload());
    this.root = el("div", { className: "dataset-picker" },
      field("Dataset on this machine", this.list),
      field("…or a folder (train.jsonl, valid.jsonl) or a .jsonl file", this.path, "a path wins over the list"),
      field("…or upload a .jsonl file", this.file, "10% of its rows become the validation set"),
      this.note);
  }

  async load() {
    const r = await getJSON("/api/dataset/local").catch(() => null);
    const rows = r?.ok ? r.body.datasets : [];
    const keep = this.list.value;
    this.list.replaceChildren(...(rows.length ? [] : [el("option", { value: "", textContent: "no datasets yet" })]),
      ...rows.map((d) => el("option", { value: d.path, textContent: `${d.name} · ${size(d.size_bytes)}${d.has_valid ? "" : " · no valid split"}` })));
    if (keep && rows.some((d) => d.path === keep)) this.list.value = keep;
  }

  choose(path) {
    this.path.value = "";
    if (![...this.list.options].some((o) => o.value === path)) {
      this.list.append(el("option", { value: path, textContent: path.split("/").pop() }));
    }
    this.list.value = path;
    this.onChange();
  }

  value() {
    return this.path.value.trim() || this.list.value || null;
  }

  async upload() {
    const file = this.file.files[0];
    if (!file) return;
    this.note.textContent = `Uploading ${file.name}…`;
    const r = await postJSON("/api/dataset/upload", { name: file.name, train: await file.text() });
    this.file.value = "";
    if (!r.ok) {
      this.note.textContent = errorOf(r);
      return;
    }
    this.note.textContent = `Saved as ${r.body.name}.`;
    await this.load();
    this.choose(r.body.path);
  }
}

// The inspection result as a summary, the problems (each with its file and line) and samples.
export function renderInspection(box, r) {
  box.dataset.ok = r.ok ? "1" : "0";
  const splits = Object.entries(r.splits || {});
  const summary = el("table", { className: "kv inspect-summary" });
  const row = (k, v) => summary.append(el("tr", {}, el("th", { scope: "row", textContent: k }), el("td", { textContent: v })));
  row("format", r.format || "unknown");
  for (const [name, s] of splits) {
    row(`${name} rows`, `${s.rows}${s.bad_rows ? ` (${s.bad_rows} unusable)` : ""}`);
  }
  row("fields", Object.entries(r.fields || {}).map(([k, n]) => `${k} (${n})`).join(", ") || "—");
  if (r.tokens) row("tokens per row", `${r.tokens.min}–${r.tokens.max}, mean ${r.tokens.mean}, ${r.tokens.total.toLocaleString()} in all (${r.token_model})`);
  else row("tokens per row", "not counted");
  const verdict = el("p", { className: `inspect-verdict ${r.ok ? "ok" : "bad"}`, role: "status",
    textContent: r.ok ? `Ready to train: ${r.n_train} training rows, ${r.n_valid} validation rows${r.problem_count ? ` (${r.problem_count} problems below)` : ""}.`
      : `Not trainable: ${r.error}` });
  const problems = el("div", { className: "inspect-problems" });
  if (r.problem_count) {
    problems.append(el("h3", { textContent: `Problems (${r.problem_count})` }),
      el("ul", {}, ...r.problems.map((p) => el("li", { dataset: { line: String(p.line), split: p.split } },
        el("span", { className: "where", textContent: p.line ? `${p.split}.jsonl line ${p.line}` : p.split }), `: ${p.message}`))));
    if (r.problem_count > r.problems.length) problems.append(el("p", { className: "muted", textContent: `…and ${r.problem_count - r.problems.length} more.` }));
  } else {
    problems.append(el("p", { className: "muted", textContent: "No problems found." }));
  }
  const samples = el("div", { className: "inspect-samples" }, el("h3", { textContent: "Samples" }),
    ...(r.samples || []).map((s) => el("details", {}, el("summary", { textContent: `line ${s.line}: ${preview(s.row)}` }),
      el("pre", { textContent: JSON.stringify(s.row, null, 2) }))));
  box.replaceChildren(verdict, summary, problems, samples);
}

function preview(row) {
  const text = row.messages ? row.messages.map((m) => `${m.role}: ${m.content}`).join(" · ")
    : row.prompt !== undefined ? `${row.prompt} → ${row.completion}` : row.text || JSON.stringify(row);
  return text.length > 90 ? `${text.slice(0, 90)}…` : text;
}

export class DatasetPage {
  constructor(section) {
    this.picker = new DatasetPicker("ds", { onChange: () => this.clear() });
    this.model = el("input", { id: "ds-model", type: "text", placeholder: "the served model", autocomplete: "off" });
    this.maxLen = el("input", { id: "ds-maxlen", type: "number", min: 1, step: 1, value: 512 });
    this.result = el("div", { className: "inspect-result", "aria-live": "polite" });
    this.handBtn = button("Fine-tune on this", () => this.handOff(), "primary");
    this.handBtn.hidden = true;
    const form = el("form", { className: "lab-form", id: "ds-form" },
      el("fieldset", {}, el("legend", { textContent: "1 · Dataset" }), this.picker.root),
      el("fieldset", {}, el("legend", { textContent: "2 · Check it" }),
        el("div", { className: "lab-grid" },
          field("Count tokens with (model id or folder)", this.model, "empty: the served model"),
          field("Max tokens per row", this.maxLen, "longer rows are flagged")),
        el("div", { className: "row" }, el("button", { type: "submit", className: "primary", textContent: "Inspect" }), this.handBtn)));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.inspect();
    });
    section.append(el("h1", { textContent: "Dataset" }), labNav("dataset"),
      el("p", { className: "muted", textContent: "Look at a training set before a job trains on it: its rows, fields, token counts and every row the trainer could not read." }),
      form, el("section", { className: "card", "aria-labelledby": "h-ds-result" }, el("h2", { id: "h-ds-result", textContent: "What is in it" }), this.result));
    this.clear();
  }

  show() {
    this.picker.load();
  }

  clear() {
    this.handBtn.hidden = true;
    this.result.replaceChildren(el("p", { className: "muted", textContent: "Pick a dataset and press Inspect." }));
  }

  async inspect() {
    const path = this.picker.value();
    if (!path) return this.result.replaceChildren(el("p", { className: "error-text", role: "alert", textContent: "Pick a dataset first." }));
    this.result.replaceChildren(el("p", { className: "muted", textContent: "Reading…" }));
    const body = { path, samples: 3 };
    if (this.model.value.trim()) body.model = this.model.value.trim();
    if (this.maxLen.value) body.max_seq_length = Number(this.maxLen.value);
    const r = await postJSON("/api/dataset/inspect", body);
    if (!r.ok) return this.result.replaceChildren(el("p", { className: "error-text", role: "alert", textContent: errorOf(r) }));
    renderInspection(this.result, r.body);
    this.handBtn.hidden = !r.body.ok;
    this.inspected = r.body.path;
  }

  handOff() {
    handoff.dataset = this.inspected;
    location.hash = "#finetune";
  }
}
