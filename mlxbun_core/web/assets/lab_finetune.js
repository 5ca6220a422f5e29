// The Fine-tune page (#finetune): pick a model and a dataset, inspect the dataset (a
// dataset must pass before Train is offered), set the LoRA recipe, submit
// (POST /api/finetune/submit), watch the loss chart fill from the job's metric events,
// cancel, and at the end mount the adapter (POST /v1/adapters), try it, or chat with it.
import { LossChart } from "./lab_chart.js";
import {
  button, el, errorOf, field, handoff, JobPanel, labNav, ModelPicker, postJSON, recentJobs, size,
} from "./lab_common.js";
import { DatasetPicker, renderInspection } from "./lab_dataset.js";

// [name, label, default, step, min, hint]
const KNOBS = [
  ["rank", "LoRA rank", 8, 1, 1, "adapter width: 4–64"],
  ["iters", "Steps", 100, 1, 1, "training iterations"],
  ["learning_rate", "Learning rate", 0.0002, "any", 0, null],
  ["batch_size", "Batch size", 1, 1, 1, null],
  ["max_seq_length", "Max tokens per row", 512, 1, 1, "longer rows are cut"],
  ["steps_per_eval", "Validate every", 50, 1, 1, "steps between validation losses"],
];
const ADVANCED = [
  ["num_layers", "Layers to adapt", -1, 1, -1, "-1: every layer"],
  ["scale", "LoRA scale", 20, "any", 0, null],
  ["lora_dropout", "Dropout", 0, "any", 0, null],
  ["grad_accumulation_steps", "Gradient accumulation", 1, 1, 1, null],
  ["seed", "Seed", 0, 1, 0, null],
];

function knob([name, label, value, step, min, hint]) {
  const input = el("input", { id: `ft-${name}`, name, type: "number", value, step, min });
  return field(label, input, hint);
}

export class FinetunePage {
  constructor(section) {
    this.model = new ModelPicker("ft", { onChange: () => this.stale() });
    this.data = new DatasetPicker("ft", { onChange: () => this.stale() });
    this.inspectBtn = button("Inspect the dataset", () => this.inspect());
    this.inspectBtn.id = "ft-inspect";
    this.inspection = el("div", { className: "inspect-result", "aria-live": "polite" });
    this.submitBtn = el("button", { type: "submit", className: "primary", textContent: "Train", disabled: true });
    this.error = el("p", { className: "error-text", role: "alert", hidden: true });
    this.chart = new LossChart();
    this.stats = el("p", { className: "muted train-stats" });
    this.panel = new JobPanel("Fine-tune", { onEvent: (e) => this.onEvent(e), onDone: (e) => this.finished(e) });
    this.panel.root.insertBefore(this.chart.root, this.panel.message);
    this.panel.root.insertBefore(this.stats, this.panel.message);
    this.jobs = el("ul", { className: "lab-jobs", "aria-live": "polite" });
    this.form = el("form", { className: "lab-form", id: "ft-form" },
      el("fieldset", {}, el("legend", { textContent: "1 · Model" }), this.model.root),
      el("fieldset", {}, el("legend", { textContent: "2 · Dataset" }), this.data.root,
        el("div", { className: "row" }, this.inspectBtn), this.inspection),
      el("fieldset", {}, el("legend", { textContent: "3 · Recipe" }), el("div", { className: "lab-grid" }, ...KNOBS.map(knob)),
        el("details", {}, el("summary", { textContent: "More settings" }), el("div", { className: "lab-grid" }, ...ADVANCED.map(knob)))),
      el("div", { className: "row" }, this.submitBtn, el("span", { className: "muted", id: "ft-gate", textContent: "Inspect the dataset first." })),
      this.error);
    this.form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.submit();
    });
    section.append(el("h1", { textContent: "Fine-tune" }), labNav("finetune"),
      el("p", { className: "muted", textContent: "Train a LoRA adapter on your own examples, then mount it next to the served model." }),
      this.form,
      el("section", { className: "card", "aria-labelledby": "h-ft-job" }, el("h2", { id: "h-ft-job", textContent: "Training" }), this.panel.root),
      el("section", { className: "card", "aria-labelledby": "h-ft-jobs" }, el("h2", { id: "h-ft-jobs", textContent: "Recent fine-tune jobs" }), this.jobs));
  }

  async show() {
    await Promise.all([this.model.load(), this.data.load()]);
    if (handoff.dataset) {
      this.data.choose(handoff.dataset);
      handoff.dataset = null;
      this.inspect();
    }
    recentJobs(this.jobs, "finetune", (id) => this.watch(id));
  }

  stale() {
    this.inspected = null;
    this.submitBtn.disabled = true;
    this.inspection.replaceChildren();
    document.getElementById("ft-gate").hidden = false;
  }

  async inspect() {
    const path = this.data.value();
    if (!path) return this.fail("Pick a dataset first.");
    this.inspection.replaceChildren(el("p", { className: "muted", textContent: "Reading…" }));
    const model = this.model.value();
    const body = { path, max_seq_length: Number(this.form.elements.max_seq_length.value) || undefined };
    if (model) body.model = model.model_id || model.model_dir;
    const r = await postJSON("/api/dataset/inspect", body);
    if (!r.ok) {
      this.inspection.replaceChildren(el("p", { className: "error-text", role: "alert", textContent: errorOf(r) }));
      return;
    }
    renderInspection(this.inspection, r.body);
    this.inspected = r.body.ok ? r.body.path : null;
    this.submitBtn.disabled = !this.inspected;
    document.getElementById("ft-gate").hidden = Boolean(this.inspected);
  }

  recipe() {
    const out = {};
    for (const [name] of [...KNOBS, ...ADVANCED]) {
      const v = this.form.elements[name].value;
      if (v !== "") out[name] = Number(v);
    }
    return out;
  }

  async submit() {
    this.error.hidden = true;
    const model = this.model.value();
    if (!model) return this.fail("Pick a model first.");
    if (!this.inspected) return this.fail("Inspect the dataset first.");
    const body = { ...(model.model_dir ? { model_dir: model.model_dir } : { model_id: model.model_id }), data_dir: this.inspected, ...this.recipe() };
    this.submitBtn.disabled = true;
    const r = await postJSON("/api/finetune/submit", body);
    this.submitBtn.disabled = false;
    if (!r.ok) return this.fail(errorOf(r));
    this.adapterPath = r.body.adapter_path;
    this.watch(r.body.job_id, body.iters);
    recentJobs(this.jobs, "finetune", (id) => this.watch(id));
  }

  watch(jobId, iters = 0) {
    this.chart.reset(iters);
    this.stats.textContent = "";
    this.panel.watch(jobId);
  }

  fail(text) {
    this.error.textContent = text;
    this.error.hidden = false;
  }

  onEvent(e) {
    this.chart.add(e);
    if (e.type === "metric" && e.kind === "train") {
      const bits = [`step ${e.step}`, `loss ${e.loss.toFixed(4)}`];
      if (e.tokens_per_sec) bits.push(`${Math.round(e.tokens_per_sec)} tokens/s`);
      if (e.peak_memory_gb) bits.push(`peak memory ${size(e.peak_memory_gb * 1e9)}`);
      this.stats.textContent = bits.join(" · ");
    }
  }

  finished(event) {
    recentJobs(this.jobs, "finetune", (id) => this.watch(id));
    if (event.type !== "done") return;
    const path = event.output_dir || this.adapterPath;
    const id = el("input", { id: "ft-adapter-id", type: "text", value: path.split("/").pop().replace(/[^A-Za-z0-9._-]/g, "-").slice(0, 60) });
    this.mountNote = el("p", { role: "status", className: "mount-note" });
    this.tryBox = el("div", { className: "try-adapter", hidden: true });
    const mount = button("Mount the adapter", () => this.mount(id.value.trim(), path), "primary");
    mount.id = "ft-mount";
    this.panel.result.replaceChildren(
      el("p", {}, "Adapter saved in ", el("code", { textContent: path }), "."),
      el("div", { className: "row" }, field("Adapter id", id), mount), this.mountNote, this.tryBox);
  }

  async mount(id, path) {
    const r = await postJSON("/v1/adapters", { id, path });
    if (!r.ok) {
      this.mountNote.textContent = errorOf(r);
      return;
    }
    this.adapterId = r.body.id;
    this.mountNote.textContent = `Mounted as ${r.body.id}: ${r.body.mounted_layers} layers, rank ${r.body.rank}. Requests that name "adapter": "${r.body.id}" use it.`;
    const prompt = el("input", { id: "ft-try-prompt", type: "text", placeholder: "Ask the adapted model", autocomplete: "off" });
    const reply = el("p", { className: "try-reply", "aria-live": "polite" });
    const form = el("form", { className: "row" }, field("Try it", prompt),
      el("button", { type: "submit", textContent: "Ask" }),
      button("Chat with it", () => window.dispatchEvent(new CustomEvent("mlxbun:chat-with-adapter", { detail: r.body.id }))));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      reply.textContent = "…";
      const a = await postJSON("/v1/chat/completions", { model: document.getElementById("model-name")?.textContent || "default", adapter: this.adapterId, max_tokens: 48,
        messages: [{ role: "user", content: prompt.value || "Hello" }] });
      reply.textContent = a.ok ? a.body.choices[0].message.content || "(empty answer)" : errorOf(a);
      reply.dataset.ok = a.ok ? "1" : "0";
    });
    this.tryBox.replaceChildren(form, reply);
    this.tryBox.hidden = false;
  }
}
