// Drawn curves kept in this browser (localStorage), the designer's presets, and the hand-off
// from the curve designer to the chat ("use in chat"). The chat session itself keeps the
// curve it uses on the server (the set_curve frame), so a saved chat reopens with it.
export const PRESETS = {
  identity: [[-20, -20], [0, 0]],
  sharpen: [[-20, -20], [-10, -19], [-3, -14], [0, 0]],
  soften: [[-20, -20], [-10, -5], [0, 0]],
  plateau: [[-20, -20], [-6, -12], [-2, -11], [0, -10]],
};
const SAVED = "mlxbun.curves";
const HANDOFF = "mlxbun.useCurve";
const MAX_SAVED = 50;

export function savedCurves() {
  try {
    const list = JSON.parse(localStorage.getItem(SAVED) || "[]");
    return Array.isArray(list) ? list.filter((c) => c && typeof c.name === "string" && Array.isArray(c.points)) : [];
  } catch {
    return [];
  }
}

// Keep ``{name, points}`` (a curve of the same name is replaced); the newest first.
export function saveCurve(curve) {
  const list = [curve, ...savedCurves().filter((c) => c.name !== curve.name)].slice(0, MAX_SAVED);
  localStorage.setItem(SAVED, JSON.stringify(list));
}

// Every curve the chat can pick: the presets (but the plain diagonal), then the saved ones.
export function pickableCurves() {
  const presets = Object.entries(PRESETS).filter(([name]) => name !== "identity")
    .map(([name, points]) => ({ name, points }));
  const saved = savedCurves();
  return [...saved, ...presets.filter((p) => !saved.some((s) => s.name === p.name))];
}

export function handOff(curve) {
  localStorage.setItem(HANDOFF, JSON.stringify(curve));
}

export function takeHandOff() {
  const raw = localStorage.getItem(HANDOFF);
  localStorage.removeItem(HANDOFF);
  try {
    return raw ? JSON.parse(raw) : null;
  } catch {
    return null;
  }
}
