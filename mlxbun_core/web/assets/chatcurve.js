// The chat's HLG curve: pick one (a preset, a curve saved on the Curves page, or none) in
// the chat settings; the server keeps it with the session and sends it as ``hlg.points``
// with each turn. A chip above the message box shows it and removes it. The server checks
// the curve (it must never go down) and its refusal is shown here.
import { pickableCurves, takeHandOff } from "./curvestore.js";

const h = (tag, props = {}, ...children) => {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
};

export class ChatCurve {
  constructor(send) {
    this.send = send;
    this.curve = null;
    this.pending = false;
    this.select = h("select", { id: "chat-curve" });
    this.note = h("span", { id: "chat-curve-note", className: "muted" });
    this.note.setAttribute("role", "status");
    const label = h("label", { htmlFor: "chat-curve", textContent: "Curve" });
    const fieldset = h("fieldset", { className: "curve-pick" },
      h("legend", {}, "Sampling curve ", h("small", { textContent: "(HLG: replaces temperature)" })),
      label, this.select,
      h("a", { href: "/curves", textContent: "Draw one" }), this.note);
    const settings = document.getElementById("settings");
    settings.insertBefore(fieldset, settings.lastElementChild); // before the Save buttons
    this.select.addEventListener("focus", () => this.options());
    this.select.addEventListener("change", () => {
      const picked = pickableCurves().find((c) => c.name === this.select.value);
      this.set(picked ? { name: picked.name, points: picked.points } : null);
    });
    this.removeButton = h("button", { type: "button", className: "icon-btn", textContent: "✕" });
    this.removeButton.setAttribute("aria-label", "Remove the sampling curve from this chat");
    this.removeButton.addEventListener("click", () => this.set(null));
    this.chipName = h("span");
    this.chip = h("div", { id: "curve-chip", className: "curve-chip", hidden: true },
      h("span", { textContent: "Curve: " }), this.chipName, this.removeButton);
    this.chip.title = "This chat samples with a drawn HLG curve instead of temperature";
    const composer = document.getElementById("composer");
    composer.insertBefore(this.chip, composer.firstChild);
    this.options();
  }

  options() {
    const current = this.curve?.name;
    const curves = pickableCurves();
    const opts = [h("option", { value: "", textContent: "None (temperature)" }),
      ...curves.map((c) => h("option", { value: c.name, textContent: c.name }))];
    if (current && !curves.some((c) => c.name === current)) {
      opts.push(h("option", { value: current, textContent: `${current} (this chat's)` }));
    }
    this.select.replaceChildren(...opts);
    this.select.value = current || "";
  }

  // After the socket is ready (and the open chat reopened): a curve handed over by the
  // Curves page ("use in chat") goes to this chat.
  ready() {
    const handed = takeHandOff();
    if (handed) this.set(handed);
  }

  set(curve) {
    this.pending = true;
    this.note.textContent = "";
    delete this.note.dataset.bad;
    this.send({ type: "set_curve", curve });
  }

  // The server's settings frame: the curve the chat has now.
  show(frame) {
    this.curve = frame.curve || null;
    this.chip.hidden = !this.curve;
    this.chipName.textContent = this.curve ? this.curve.name : "";
    this.options();
  }

  // An error frame: if it answers our set_curve (the server's messages about it name the
  // curve field; the greeting's settings frame may come between), say so by the picker too.
  refused(message) {
    if (!this.pending || !/^curve\b/.test(message)) return;
    this.pending = false;
    this.note.textContent = `Refused: ${message}`;
    this.note.dataset.bad = "1";
    this.options();
  }
}
