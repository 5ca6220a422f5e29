// The fine-tune page's loss chart: train and validation loss by step, drawn as SVG
// from the job's metric events. No library: two polylines, their points, and axes with
// a few ticks. The figure's caption says the latest numbers for screen readers.
const NS = "http://www.w3.org/2000/svg";
const W = 640;
const H = 260;
const PAD = { left: 52, right: 16, top: 14, bottom: 34 };

function svg(tag, attrs = {}) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function ticks(lo, hi, n) {
  if (hi === lo) return [lo];
  const step = (hi - lo) / (n - 1);
  return Array.from({ length: n }, (_, i) => lo + i * step);
}

// Whole steps for the x axis, about six of them: 1, 2 or 5 times a power of ten apart.
function stepTicks(maxStep) {
  const raw = maxStep / 6;
  const pow = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  const gap = [1, 2, 5, 10].map((m) => m * pow).find((g) => g >= raw) || 10 * pow;
  const out = [];
  for (let t = 0; t <= maxStep; t += gap) out.push(t);
  return out;
}

const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2));

export class LossChart {
  constructor() {
    this.series = { train: [], val: [] };
    this.totalSteps = 0;
    this.svg = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "loss-chart", role: "img", "aria-labelledby": "loss-caption" });
    this.caption = document.createElement("figcaption");
    this.caption.id = "loss-caption";
    this.root = document.createElement("figure");
    this.root.className = "loss-figure";
    this.root.append(this.svg, this.caption);
    this.draw();
  }

  reset(totalSteps = 0) {
    this.series = { train: [], val: [] };
    this.totalSteps = totalSteps;
    this.draw();
  }

  // One JobEvent; only metric events with a loss change the chart.
  add(event) {
    if (event.type !== "metric" || typeof event.loss !== "number" || !Number.isFinite(event.loss)) return;
    const line = this.series[event.kind === "val" ? "val" : "train"];
    line.push([event.step, event.loss]);
    this.draw();
  }

  draw() {
    const { train, val } = this.series;
    const all = [...train, ...val];
    this.root.dataset.trainPoints = String(train.length);
    this.root.dataset.valPoints = String(val.length);
    this.svg.replaceChildren();
    const maxStep = Math.max(this.totalSteps, ...all.map((p) => p[0]), 1);
    const losses = all.map((p) => p[1]);
    let lo = losses.length ? Math.min(...losses) : 0;
    let hi = losses.length ? Math.max(...losses) : 1;
    if (hi - lo < 1e-6) { lo -= 0.5; hi += 0.5; }
    const pad = (hi - lo) * 0.08;
    lo = Math.max(0, lo - pad);
    hi += pad;
    const x = (s) => PAD.left + (s / maxStep) * (W - PAD.left - PAD.right);
    const y = (v) => PAD.top + (1 - (v - lo) / (hi - lo)) * (H - PAD.top - PAD.bottom);
    const axes = svg("g", { class: "axes" });
    for (const t of ticks(lo, hi, 5)) {
      axes.append(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: y(t), y2: y(t), class: "grid-line" }));
      const label = svg("text", { x: PAD.left - 6, y: y(t) + 4, "text-anchor": "end" });
      label.textContent = fmt(t);
      axes.append(label);
    }
    for (const t of stepTicks(maxStep)) {
      const label = svg("text", { x: x(t), y: H - PAD.bottom + 16, "text-anchor": "middle" });
      label.textContent = String(Math.round(t));
      axes.append(label);
    }
    const xName = svg("text", { x: W - PAD.right, y: H - 4, "text-anchor": "end" });
    xName.textContent = "step";
    axes.append(xName);
    this.svg.append(axes);
    for (const [name, points] of [["train", train], ["val", val]]) {
      if (!points.length) continue;
      const g = svg("g", { class: `series ${name}` });
      g.append(svg("polyline", { points: points.map(([s, v]) => `${x(s)},${y(v)}`).join(" ") }));
      for (const [s, v] of points) {
        const dot = svg("circle", { cx: x(s), cy: y(v), r: name === "val" ? 4 : 2.5 });
        const tip = svg("title");
        tip.textContent = `${name} loss ${v.toFixed(4)} at step ${s}`;
        dot.append(tip);
        g.append(dot);
      }
      this.svg.append(g);
    }
    const last = (p) => (p.length ? `${p[p.length - 1][1].toFixed(4)} at step ${p[p.length - 1][0]}` : "none yet");
    this.caption.replaceChildren(
      chip("train"), ` train loss ${last(train)} · `, chip("val"), ` validation loss ${last(val)}`);
  }
}

function chip(name) {
  const c = document.createElement("span");
  c.className = `legend ${name}`;
  c.setAttribute("aria-hidden", "true");
  return c;
}
