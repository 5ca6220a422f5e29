// /curve-terrain: the HLG tone curve of engine/hlg.py drawn for a range of pivot offsets,
// recomputed as the knobs change (the same formula the server samples with).
const NS = "http://www.w3.org/2000/svg";
const svg = document.getElementById("terrain");
const form = document.getElementById("terrain-form");
const Z = [-24, 0];

export function hlg(logprob, { width, shoulder, toe, pivot, gain }) {
  const z = logprob + pivot; // the top token sits at 0, the pivot `pivot` nats below it
  const roll = (d, b) => (b <= 0 ? 0 : gain * b * Math.log1p(Math.max(d, 0) / b));
  if (z > width) return gain * width + roll(z - width, shoulder);
  if (z < -width) return -gain * width - roll(-z - width, toe);
  return gain * z;
}

function line(points, color, dashed = false) {
  const el = document.createElementNS(NS, "polyline");
  el.setAttribute("points", points.map(([x, y]) => `${x},${y}`).join(" "));
  el.setAttribute("fill", "none");
  el.setAttribute("stroke", color);
  el.setAttribute("stroke-width", dashed ? 1 : 1.6);
  if (dashed) el.setAttribute("stroke-dasharray", "4 4");
  svg.append(el);
}

function draw() {
  const v = Object.fromEntries(new FormData(form).entries());
  const gain = 1 / Math.max(Number(v.temperature) || 1, 0.05);
  svg.replaceChildren();
  const sx = (x) => 20 + (x - Z[0]) / (Z[1] - Z[0]) * 380;
  const sy = (y) => 150 - y * 5;
  line([[sx(Z[0]), sy(Z[0])], [sx(0), sy(0)]], "gray", true);
  for (let pivot = 0; pivot <= 12; pivot += 2) {
    const knobs = { width: Number(v.width), shoulder: Number(v.shoulder), toe: Number(v.toe), pivot, gain };
    const pts = [];
    for (let x = Z[0]; x <= 0; x += 0.25) pts.push([sx(x), Math.max(0, Math.min(300, sy(hlg(x, knobs) - pivot)))]);
    line(pts, `hsl(${210 + pivot * 10} 80% ${35 + pivot * 3}%)`);
  }
}

form.addEventListener("input", draw);
draw();
