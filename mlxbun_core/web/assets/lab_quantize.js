// The Quantize page (#quantize): pick a model, check that mlx-lm can quantize it
// (POST /api/quantize/inspect), choose the recipe, submit (POST /api/quantize/submit),
// follow the job, and serve the result from the library (POST /api/hub/serve).
import {
  button, el, errorOf, field, getJSON, JobPanel, labNav, ModelPicker, postJSON, recentJobs, select, size,
} from "./lab_common.js";

const BITS = [2, 3, 4, 5, 6, 8];
const GROUPS = [32, 64, 128];
const MODES = [["affine", "affine (any bits)"], ["mxfp4", "mxfp4"], ["nvfp4", "nvfp4"], ["mxfp8", "mxfp8"]];
const RECIPES = [["", "uniform (the bits above)"], ["mixed_2_6", "mixed 2/6-bit"], ["mixed_3_4", "mixed 3/4-bit"],
  ["mixed_3_6", "mixed 3/6-bit"], ["mixed_4_6", "mixed 4/6-bit"]];

export class QuantizePage {
  constructor(section) {
    this.picker = new ModelPicker("q", { onChange: () => this.check() });
    this.checkOut = el("p", { className: "muted", role: "status", id: "q-check" });
    this.bits = select("bits", BITS.map((b) => [b, `${b}-bit`]), 4);
    this.group = select("group_size", GROUPS, 64);
    this.mode = select("mode", MODES, "affine");
    this.recipe = select("recipe", RECIPES, "");
    this.estimate = el("p", { className: "muted", id: "q-estimate" });
    for (const [c, id] of [[this.bits, "q-bits"], [this.group, "q-group"], [this.mode, "q-mode"], [this.recipe, "q-recipe"]]) {
      c.id = id;
      c.addEventListener("change", () => this.recipeChanged());
    }
    this.submitBtn = el("button", { type: "submit", className: "primary", textContent: "Quantize" });
    this.error = el("p", { className: "error-text", role: "alert", hidden: true });
    this.panel = new JobPanel("Quantize", { onDone: (e) => this.finished(e) });
    this.jobs = el("ul", { className: "lab-jobs", "aria-live": "polite" });
    const form = el("form", { className: "lab-form", id: "q-form" },
      el("fieldset", {}, el("legend", { textContent: "1 · Model" }), this.picker.root, this.checkOut),
      el("fieldset", {}, el("legend", { textContent: "2 · Recipe" }),
        el("div", { className: "lab-grid" }, field("Bits", this.bits), field("Group size", this.group, "smaller: more accurate, larger file"),
          field("Mode", this.mode, "mx/nv formats fix their own bits"), field("Mixed precision", this.recipe, "affine mode only")),
        this.estimate),
      el("div", { className: "row" }, this.submitBtn), this.error);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.submit();
    });
    section.append(el("h1", { textContent: "Quantize" }), labNav("quantize"),
      el("p", { className: "muted", textContent: "Make a smaller MLX copy of a model: it lands in your library, ready to serve." }),
      form,
      el("section", { className: "card", "aria-labelledby": "h-q-job" }, el("h2", { id: "h-q-job", textContent: "Progress" }), this.panel.root),
      el("section", { className: "card", "aria-labelledby": "h-q-jobs" }, el("h2", { id: "h-q-jobs", textContent: "Recent quantize jobs" }), this.jobs));
  }

  async show() {
    // a model that is already quantized cannot be quantized again: list the others
    await this.picker.load((m) => !m.quant_bits);
    this.check();
    this.listJobs();
  }

  listJobs() {
    recentJobs(this.jobs, "quantize", (id) => this.panel.watch(id));
  }

  recipeChanged() {
    const affine = this.mode.value === "affine";
    this.bits.disabled = !affine || Boolean(this.recipe.value);
    this.recipe.disabled = !affine;
    if (!affine) this.recipe.value = "";
    this.updateEstimate();
  }

  updateEstimate() {
    const gb = this.info?.ok ? this.info.size_gb : 0;
    if (!gb) return (this.estimate.textContent = "");
    const bits = this.mode.value === "affine" ? Number(this.bits.value) : this.mode.value === "mxfp8" ? 8 : 4;
    // weights at ~16 bits now; each group stores a scale and a bias (two 16-bit numbers)
    const per = bits + 32 / Number(this.group.value);
    this.estimate.textContent = this.recipe.value ? "Mixed recipes keep some layers at the higher width."
      : `About ${size(gb * 1e9 * per / 16)} from ${size(gb * 1e9)} (${per.toFixed(2)} bits per weight).`;
  }

  async check() {
    const model = this.picker.value();
    this.info = null;
    if (!model) return (this.checkOut.textContent = "Pick a model.");
    this.checkOut.textContent = "Checking…";
    const r = await postJSON("/api/quantize/inspect", { model_id: model.model_id || model.model_dir });
    this.info = r.body;
    this.checkOut.dataset.ok = r.body?.ok ? "1" : "0";
    this.checkOut.textContent = r.body?.ok ? `${r.body.arch} · ${size(r.body.size_gb * 1e9)} of weights · can be quantized`
      : `Cannot quantize this model: ${r.body?.error || errorOf(r)}`;
    this.updateEstimate();
  }

  async submit() {
    const model = this.picker.value();
    this.error.hidden = true;
    if (!model) return this.fail("Pick a model first.");
    const body = { model_id: model.model_id || model.model_dir, group_size: Number(this.group.value), mode: this.mode.value };
    if (this.recipe.value) body.recipe = this.recipe.value;
    else if (this.mode.value === "affine") body.bits = Number(this.bits.value);
    else body.bits = this.mode.value === "mxfp8" ? 8 : 4;
    this.submitBtn.disabled = true;
    const r = await postJSON("/api/quantize/submit", body);
    this.submitBtn.disabled = false;
    if (!r.ok) return this.fail(errorOf(r));
    this.output = r.body.output_dir;
    this.panel.watch(r.body.job_id);
    this.listJobs();
  }

  fail(text) {
    this.error.textContent = text;
    this.error.hidden = false;
  }

  async finished(event) {
    this.listJobs();
    if (event.type !== "done") return;
    const out = event.output_dir || this.output;
    const name = out ? out.split("/").pop() : null;
    const s = event.summary || {};
    const listed = await this.inLibrary(name);
    this.panel.result.replaceChildren(
      el("p", {}, `Saved ${size(s.size_bytes)} to `, el("code", { textContent: out }), ` in ${s.seconds ?? "?"} s.`),
      el("p", { className: "lab-listed", textContent: listed ? `${name} is in your library.` : "Refresh the Models page to see it in the library." }),
      el("div", { className: "row" }, button(`Serve ${name}`, () => this.serve(name), "primary"),
        el("a", { href: "#models", textContent: "Open the Models page" })),
      this.serveNote = el("p", { className: "serve-note", role: "status" }));
  }

  async inLibrary(name) {
    const r = await getJSON("/api/hub/local?refresh=1").catch(() => null);
    return Boolean(r?.ok && r.body.models.some((m) => m.repo_id === name));
  }

  async serve(name) {
    const r = await postJSON("/api/hub/serve", { model: name });
    if (r.body?.restart_required) {
      this.serveNote.replaceChildren("This server serves one model. To serve it, restart the server with ",
        el("code", { textContent: r.body.command }), ".");
    } else if (r.ok && r.body?.pool) this.poolState(name, r.body.state === "ready" ? "resident" : "loading");
    else if (r.ok && r.body?.ok) this.serveNote.textContent = `${name} is ${r.body.serving ? "being served" : "loading"}.`;
    else this.serveNote.textContent = errorOf(r);
  }

  // Under --isolate --model-pool the server starts the model next to the default one:
  // follow its /v1/models state until it is loaded (or failed).
  async poolState(name, state, tries = 0) {
    const note = this.serveNote;
    note.dataset.state = state;
    if (state === "resident") {
      note.replaceChildren(`${name} is loaded in this server's model pool: requests that name it (`,
        el("code", { textContent: `"model": "${name}"` }), ") are answered by it.");
      return;
    }
    if (state === "failed" || tries > 300) {
      note.textContent = `${name} did not start in the model pool (see the server's log).`;
      return;
    }
    note.textContent = `${name} is starting in this server's model pool…`;
    await new Promise((resolve) => setTimeout(resolve, 1000));
    if (!note.isConnected) return;
    const r = await getJSON(`/v1/models/${encodeURIComponent(name)}`).catch(() => null);
    this.poolState(name, r?.ok ? r.body.state : "loading", tries + 1);
  }
}
