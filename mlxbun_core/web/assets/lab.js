// The lab pages (#quantize, #finetune, #dataset): step-by-step forms over the job API.
// Each page is its own module; this one makes their sections and shows the one routed to.
import { DatasetPage } from "./lab_dataset.js";
import { FinetunePage } from "./lab_finetune.js";
import { QuantizePage } from "./lab_quantize.js";

export const LAB_ROUTES = ["quantize", "finetune", "dataset"];

const PAGES = { quantize: ["Quantize", QuantizePage], finetune: ["Fine-tune", FinetunePage], dataset: ["Dataset", DatasetPage] };

export class LabViews {
  constructor(main) {
    this.pages = {};
    for (const route of LAB_ROUTES) {
      const [title, Page] = PAGES[route];
      const section = document.createElement("section");
      section.id = `view-${route}`;
      section.className = "view lab-view";
      section.hidden = true;
      section.setAttribute("aria-label", title);
      main.append(section);
      this.pages[route] = new Page(section);
    }
  }

  // Called on every route change: the page shown refreshes its lists; the top bar's Lab
  // link is current on all three pages.
  show(route) {
    document.querySelectorAll(".views a[data-lab]").forEach((a) => {
      if (LAB_ROUTES.includes(route)) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    });
    this.pages[route]?.show();
  }
}
