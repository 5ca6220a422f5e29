// Synthesis on the Memory page: a dry run first (which chats would be read, in how many
// pieces; no model call, nothing written), then the real run with each stage ticked off
// as the SSE stream of /v1/memory/synthesize reports it. Cancel closes the stream, which
// stops the run on the server within a decode step.
import { apiKey, askForKey } from "./api.js";

const STAGES = ["ingest", "segment", "extract", "route", "create", "section-route", "patch", "link", "wikify"];
const MAX_LOG = 200;

// Each ``data:`` payload of an SSE response, parsed (``[DONE]`` as the string).
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        yield data === "[DONE]" ? data : JSON.parse(data);
      }
    }
  }
}

export class SynthesisPanel {
  constructor(box, onFinished) {
    this.onFinished = onFinished;
    this.controller = null;
    box.innerHTML = `
      <p class="muted">Reads the saved chats that are new or changed since the last run and
        writes what they say into articles. Preview it first.</p>
      <div class="row">
        <button id="memory-preview" type="button">Preview (dry run)</button>
        <button id="memory-run" type="button" class="primary" disabled
                title="Preview first">Synthesize</button>
        <button id="memory-cancel" type="button" class="danger" disabled>Cancel</button>
      </div>
      <progress id="memory-progress" max="${STAGES.length}" value="0" aria-label="Synthesis stages done" hidden></progress>
      <ol id="memory-stages" class="memory-stages" aria-label="Stages" hidden></ol>
      <p id="memory-synth-note" role="status" aria-live="polite"></p>
      <details id="memory-log-box" hidden><summary>Log</summary><ul id="memory-log" class="memory-log"></ul></details>`;
    this.$ = (id) => box.querySelector(`#${id}`);
    this.$("memory-preview").addEventListener("click", () => this.start(true));
    this.$("memory-run").addEventListener("click", () => this.start(false));
    this.$("memory-cancel").addEventListener("click", () => this.cancel());
    this.enabled = false;
    this.previewed = false; // the real run waits for a preview
  }

  enable(on) {
    this.enabled = on;
    if (this.controller) return;
    this.$("memory-preview").disabled = !on;
    if (!on) this.$("memory-run").disabled = true;
  }

  setRunning(running) {
    this.$("memory-preview").disabled = running || !this.enabled;
    this.$("memory-run").disabled = running || !this.previewed;
    this.$("memory-cancel").disabled = !running;
  }

  reset(dry) {
    const stages = this.$("memory-stages");
    stages.replaceChildren(...STAGES.map((s) => {
      const li = Object.assign(document.createElement("li"), { textContent: s });
      li.dataset.stage = s;
      li.dataset.state = "pending";
      return li;
    }));
    stages.hidden = false;
    const progress = this.$("memory-progress");
    progress.value = 0;
    progress.hidden = false;
    this.$("memory-log").replaceChildren();
    this.$("memory-log-box").hidden = false;
    this.note(dry ? "Planning…" : "Synthesizing…");
  }

  note(text, kind = "") {
    const p = this.$("memory-synth-note");
    p.textContent = text;
    p.dataset.kind = kind;
  }

  async start(dry) {
    this.controller = new AbortController();
    this.setRunning(true);
    this.reset(dry);
    let outcome = "closed";
    try {
      outcome = await this.stream(dry, this.controller.signal);
    } catch (err) {
      outcome = err.name === "AbortError" ? "cancelled" : "error";
      if (outcome === "error") this.note(`Synthesis failed: ${err.message}`, "error");
    }
    if (outcome === "cancelled") this.note("Cancelled. What was written before stays.", "error");
    this.controller = null;
    this.previewed = dry && outcome === "done"; // after a real run, preview again
    this.setRunning(false);
    if (!dry) this.onFinished();
  }

  async stream(dry, signal) {
    const headers = apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
    const response = await fetch(`/v1/memory/synthesize${dry ? "?dry=1" : ""}`, { headers, signal });
    if (response.status === 401) {
      await askForKey();
      return this.stream(dry, signal);
    }
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      this.note(body?.error || `HTTP ${response.status}`, "error");
      return "error";
    }
    for await (const event of sseEvents(response)) {
      if (event === "[DONE]") return "done";
      this.onEvent(event);
      if (event.type === "error") return "error";
    }
    return "closed";
  }

  onEvent(event) {
    const log = (text) => {
      const list = this.$("memory-log");
      list.append(Object.assign(document.createElement("li"), { textContent: text }));
      while (list.children.length > MAX_LOG) list.firstElementChild.remove();
    };
    if (event.type === "stage") {
      const index = STAGES.indexOf(event.stage);
      this.$("memory-stages").querySelectorAll("li").forEach((li, i) => {
        if (i < index) li.dataset.state = "done";
        else if (i === index) {
          li.dataset.state = "done";
          li.textContent = `${event.stage}: ${event.message}`;
        }
      });
      this.$("memory-progress").value = index + 1;
      log(`${event.stage}: ${event.message}`);
    } else if (event.type === "log") {
      log(event.message);
    } else if (event.type === "done") {
      this.note(event.message, "done");
    } else if (event.type === "error") {
      this.note(`Synthesis failed: ${event.message}`, "error");
    }
  }

  cancel() {
    this.controller?.abort();
  }
}
