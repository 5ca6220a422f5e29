// The app-aware assistant's eyes and hands: a snapshot of the visible controls for the
// model (sent as a `context` frame on every route change), and the spotlight it can show.
const INTERACTIVE = "a[href], button, input, select, textarea, [role=button], [data-spotlight]";
const MAX_ELEMENTS = 120;
let lastSnapshot = [];

function labelOf(node) {
  const aria = node.getAttribute("aria-label");
  if (aria) return aria;
  if (node.id) {
    const label = document.querySelector(`label[for="${CSS.escape(node.id)}"]`);
    if (label) return label.textContent.trim();
  }
  const wrapping = node.closest("label");
  if (wrapping) return wrapping.textContent.trim();
  return (node.textContent || node.getAttribute("placeholder") || node.title || "").trim().slice(0, 80);
}

function visible(node) {
  if (node.closest("[hidden]")) return false;
  const r = node.getBoundingClientRect();
  return r.width > 0 && r.height > 0;
}

// Visible controls outside the agent's own chrome (the chat panel itself).
export function snapshot(route) {
  const elements = [];
  let n = 0;
  for (const node of document.querySelectorAll(INTERACTIVE)) {
    if (elements.length >= MAX_ELEMENTS) break;
    if (node.closest("[data-agent-chrome]") || !visible(node)) continue;
    const ref = `e${++n}`;
    node.dataset.ref = ref;
    const row = { ref, label: labelOf(node), kind: node.type || node.tagName.toLowerCase(),
      selector: node.id ? `#${CSS.escape(node.id)}` : `[data-ref="${ref}"]` };
    if (node.getAttribute("role")) row.role = node.getAttribute("role");
    if (node.dataset.spotlight) row.spotlightId = node.dataset.spotlight;
    elements.push(row);
  }
  lastSnapshot = elements;
  return { route, capturedAt: new Date().toISOString(), elements };
}

function find(frame) {
  const tries = [];
  if (frame.ref) tries.push(() => lastSnapshot.find((e) => e.ref === frame.ref)?.selector);
  if (frame.selector) tries.push(() => frame.selector);
  if (frame.label) {
    const want = frame.label.toLowerCase();
    tries.push(() => lastSnapshot.find((e) => e.label.toLowerCase().includes(want))?.selector);
  }
  if (frame.target) tries.push(() => `[data-spotlight="${CSS.escape(frame.target)}"]`);
  for (const attempt of tries) {
    const selector = attempt();
    if (!selector) continue;
    try {
      const node = document.querySelector(selector);
      if (node && visible(node)) return node;
    } catch {
      // not a valid selector: try the next way
    }
  }
  return null;
}

// Outline the target for a few seconds, without taking focus or blocking input.
export function spotlight(frame) {
  const node = find(frame);
  const box = document.getElementById("spotlight");
  if (!node) return false;
  node.scrollIntoView({ block: "nearest", behavior: "smooth" });
  const r = node.getBoundingClientRect();
  Object.assign(box.style, { left: `${r.left - 6}px`, top: `${r.top - 6}px`,
    width: `${r.width + 12}px`, height: `${r.height + 12}px` });
  box.querySelector(".spotlight-note").textContent = frame.message || "";
  box.hidden = false;
  clearTimeout(box._timer);
  box._timer = setTimeout(() => { box.hidden = true; }, 4000);
  return true;
}
