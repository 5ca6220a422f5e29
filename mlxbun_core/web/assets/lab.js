// The lab pages (#quantize, #finetune, #dataset): for now each lists its recent jobs from
// the job API and says how to start one there; the step-by-step wizards come later.
import { getJSON } from "./api.js";

export const LAB_ROUTES = ["quantize", "finetune", "dataset"];

const PAGES = {
  quantize: { title: "Quantize", submit: "/api/quantize/submit",
    example: '{"model_id": "<repo id or path>", "bits": 4}',
    text: "Quantize a model from the library into a smaller MLX checkpoint." },
  finetune: { title: "Fine-tune", submit: "/api/finetune/submit",
    example: '{"model_dir": "/path/to/model", "data_dir": "/path/to/dataset"}',
    text: "Train a LoRA adapter on a dataset folder (train.jsonl, optional valid.jsonl)." },
  dataset: { title: "Dataset", submit: "/api/dataset/submit",
    example: '{"template_id": "…", "inputs": {}}',
    text: "Build a training dataset from a template." },
};

function section(route) {
  const page = PAGES[route];
  const el = document.createElement("section");
  el.id = `view-${route}`;
  el.className = "view lab-view";
  el.hidden = true;
  el.setAttribute("aria-label", page.title);
  const h1 = Object.assign(document.createElement("h1"), { textContent: page.title });
  const p = Object.assign(document.createElement("p"), { textContent: page.text });
  const how = document.createElement("p");
  how.className = "muted";
  how.append("The guided page is not built yet. Start a job with ",
    Object.assign(document.createElement("code"), { textContent: `POST ${page.submit} ${page.example}` }),
    "; its progress streams from ",
    Object.assign(document.createElement("code"), { textContent: "GET /api/jobs/<id>/stream" }), ".");
  const h2 = Object.assign(document.createElement("h2"), { textContent: "Recent jobs" });
  const list = document.createElement("ul");
  list.className = "lab-jobs";
  list.setAttribute("aria-live", "polite");
  el.append(h1, p, how, h2, list);
  return el;
}

export class LabViews {
  constructor(main) {
    this.sections = Object.fromEntries(LAB_ROUTES.map((r) => [r, section(r)]));
    main.append(...Object.values(this.sections));
  }

  // Called on every route change: the page shown loads its job list.
  async show(route) {
    const el = this.sections[route];
    if (!el) return;
    const list = el.querySelector(".lab-jobs");
    const r = await getJSON(`/api/jobs?limit=20&kind=${route}`).catch(() => null);
    const jobs = r?.ok ? r.body.jobs || [] : null;
    list.replaceChildren(...(jobs === null ? [li("The job list is not available here.")]
      : jobs.length ? jobs.map((j) => li(`${j.id} · ${j.status}${j.message ? ` · ${j.message}` : ""}`))
        : [li("No jobs yet.")]));
  }
}

function li(text) {
  return Object.assign(document.createElement("li"), { textContent: text });
}
