// Chat settings: the thinking switch, the system prompt, sampling (for the chat, or for
// the next message only) and what happens when the chat outgrows the model's window. The
// server keeps them with the session.
const FIELDS = ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed"];
const INTEGER = new Set(["top_k", "max_tokens", "seed"]);

export class Settings {
  constructor(send) {
    this.send = send;
    this.panel = document.getElementById("settings");
    this.toggle = document.getElementById("settings-toggle");
    this.thinking = document.getElementById("thinking");
    this.system = document.getElementById("system-prompt");
    this.note = document.getElementById("settings-note");
    this.overflow = document.getElementById("overflow-policy");
    this.inputs = Object.fromEntries(FIELDS.map((f) => [f, this.panel.querySelector(`[name=${f}]`)]));
    this.supportsThinking = false;
    this.toggle.addEventListener("click", () => this.setOpen(this.panel.hidden));
    this.overflow.addEventListener("change", () =>
      this.send({ type: "set_overflow", policy: this.overflow.value }));
    this.thinking.addEventListener("change", () =>
      this.send({ type: "set_thinking", enabled: this.thinking.checked }));
    document.getElementById("apply-session").addEventListener("click", () => this.apply("session"));
    document.getElementById("apply-next").addEventListener("click", () => this.apply("next_turn"));
  }

  setOpen(open) {
    this.panel.hidden = !open;
    this.toggle.setAttribute("aria-expanded", String(open));
  }

  ready(frame) {
    this.supportsThinking = frame.thinking;
    this.thinking.disabled = !frame.thinking;
    this.thinking.closest("label").title = frame.thinking
      ? "Let the model think before it answers" : "This model has no thinking mode";
    for (const [name, value] of Object.entries(frame.genDefaults || {})) {
      if (this.inputs[name] && value !== null && value !== undefined) this.inputs[name].placeholder = value;
    }
  }

  // The server's view of the session's settings.
  show(frame) {
    this.thinking.checked = frame.thinking ?? this.supportsThinking;
    if (frame.overflow) this.overflow.value = frame.overflow;
    if (document.activeElement !== this.system) this.system.value = frame.systemPrompt || "";
    const sampling = { ...(frame.sampling || {}), ...(frame.nextTurn || {}) };
    for (const f of FIELDS) this.inputs[f].value = sampling[f] ?? "";
    const pending = Object.keys(frame.nextTurn || {}).length;
    this.note.textContent = pending ? "Applies to the next message only." : "";
  }

  apply(scope) {
    const frame = { type: "set_sampling", scope };
    for (const f of FIELDS) {
      const text = this.inputs[f].value.trim();
      frame[f] = text === "" ? null : (INTEGER.has(f) ? parseInt(text, 10) : parseFloat(text));
    }
    this.send(frame);
    const system = this.system.value.trim();
    this.send({ type: "set_system_prompt", text: system || null });
    this.note.textContent = scope === "session" ? "Saved for this chat." : "Applies to the next message only.";
  }
}
