// Small SVG line charts for the console: a fixed time window, nice y ticks, a legend.
// No dependencies; drawn from scratch on every update (a few hundred points at most).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceStep(max, ticks) {
  const raw = max / ticks;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  const step = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10;
  return step * mag;
}

function formatValue(v) {
  if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k";
  if (v >= 10 || v === 0) return String(Math.round(v));
  return v.toFixed(v >= 1 ? 1 : 2);
}

// series: [{name, color, points: [[t, v|null], ...]}]; window in seconds ending at `now`.
function drawChart(svg, series, now, windowSeconds) {
  const width = svg.clientWidth || 400;
  const height = svg.clientHeight || 160;
  const pad = { left: 40, right: 10, top: 8, bottom: 20 };
  const w = width - pad.left - pad.right;
  const h = height - pad.top - pad.bottom;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  while (svg.firstChild) svg.removeChild(svg.firstChild);

  const start = now - windowSeconds;
  let max = 0;
  for (const s of series) for (const [t, v] of s.points) if (t >= start && v !== null && v > max) max = v;
  const step = niceStep(max > 0 ? max : 1, 4);
  const top = Math.max(step, Math.ceil((max > 0 ? max : 1) / step) * step);
  const x = (t) => pad.left + ((t - start) / windowSeconds) * w;
  const y = (v) => pad.top + h - (v / top) * h;

  const grid = svgEl("g", { class: "grid" });
  for (let v = 0; v <= top + step / 2; v += step) {
    grid.appendChild(svgEl("line", { x1: pad.left, x2: pad.left + w, y1: y(v), y2: y(v) }));
    grid.appendChild(svgEl("text", { x: pad.left - 6, y: y(v) + 4, "text-anchor": "end" }, formatValue(v)));
  }
  const minutes = Math.round(windowSeconds / 60);
  for (let m = 0; m <= minutes; m++) {
    const t = now - m * 60;
    const label = m === 0 ? "now" : `-${m}m`;
    grid.appendChild(svgEl("text", { x: x(t), y: height - 4, "text-anchor": m === 0 ? "end" : "middle" }, label));
  }
  svg.appendChild(grid);

  for (const s of series) {
    let d = "";
    let pen = false;
    for (const [t, v] of s.points) {
      if (t < start) continue;
      if (v === null || v === undefined) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    }
    if (d) svg.appendChild(svgEl("path", { d, class: "line", stroke: s.color }));
  }

  const legend = svgEl("g", { class: "legend" });
  let lx = pad.left + 6;
  for (const s of series) {
    legend.appendChild(svgEl("rect", { x: lx, y: pad.top + 2, width: 10, height: 3, fill: s.color }));
    const last = [...s.points].reverse().find(([, v]) => v !== null && v !== undefined);
    const text = svgEl("text", { x: lx + 14, y: pad.top + 7 }, `${s.name} ${last ? formatValue(last[1]) : "–"}`);
    legend.appendChild(text);
    lx += 14 + (s.name.length + 6) * 6.5;
  }
  svg.appendChild(legend);
}

window.drawChart = drawChart;
