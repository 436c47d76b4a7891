// SPDX-License-Identifier: Apache-2.0
// The memory timeline page's script: draws the embedded figures as inline SVG, decodes
// the embedded blocks (gzip-compressed JSON, see page.py) and lists the blocks live at
// the peak or at the moment the reader picks. Where the log has samples (F.held), what
// the stack held beside the live bytes is drawn over them: the cache's idle blocks and
// the queued frees of each span's sample stacked on the span's live bytes (so the top of
// the stack is what the stack held: live + cached + queued), and the pool's reserve as a
// line. The base resource's own held count is in the tooltip and the summary. No network,
// no library.
"use strict";

const F = JSON.parse(document.getElementById("memviz-figures").textContent);
const SVGNS = "http://www.w3.org/2000/svg";
const COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2",
                "#ff9da6", "#9d755d", "#3f8f8f"];
const OTHER_COLOR = "#bab0ac";
// What the stack holds beside the live bytes: areas stacked on them, then lines.
const HELD_LAYERS = [
  {key: "cached", label: "cached (idle blocks of the caching layer)", color: "#8c96a8", area: true},
  {key: "queued", label: "queued frees (base resource, not yet complete)", color: "#d8b365", area: true},
  {key: "reserved", label: "pool reserved (the driver's pools)", color: "#7b3294", area: false, dash: "6 3"},
];
const LIST_ROWS = 50;    // rows of the live-blocks list (the rest are summed in one row)
const TABLE_ROWS = 200;  // rows of the tag and failure tables

let blocks = null;       // decoded blocks (decodeBlocks)
let selected = null;     // {record, time_us, label}
let streamFilter = -1;   // stream index, -1: all

// ---- formatting -----------------------------------------------------------------------

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0, v = n;
  while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; ++u; }
  return u === 0 ? `${n} B` : `${v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)} ${units[u]}`;
}
function fmtDur(us) {
  if (us < 1000) return `${Math.round(us)} µs`;
  if (us < 1e6) return `${(us / 1000).toFixed(us < 1e4 ? 2 : 1)} ms`;
  return `${(us / 1e6).toFixed(us < 1e7 ? 3 : 1)} s`;
}
function fmtTod(rel) {
  const day = 86400e6, t = ((F.t0_us + rel) % day + day) % day;
  const p = (v, w) => String(Math.floor(v)).padStart(w, "0");
  return `${p(t / 3600e6, 2)}:${p(t / 60e6 % 60, 2)}:${p(t / 1e6 % 60, 2)}.${p(t % 1e6, 6)}`;
}
function el(tag, attrs, ...children) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}
const tagColor = (slot) => slot < F.series.tags.length ? COLORS[slot % COLORS.length] : OTHER_COLOR;
const tagLabel = (slot) => slot < F.series.tags.length ? F.tags[F.series.tags[slot]].label : "other tags";

// ---- scales ---------------------------------------------------------------------------

const W = Math.max(760, Math.min(1400, window.innerWidth - 60));
const M = {left: 70, right: 16};
const PW = W - M.left - M.right;
const xOfTime = (us) => M.left + PW * us / Math.max(1, F.span_us + 1);
const xOfSpan = (k) => M.left + PW * k / F.series.count;
function spanAt(px) {
  const k = Math.floor((px - M.left) / PW * F.series.count);
  return k < 0 || k >= F.series.count ? -1 : k;
}
function niceTicks(max, count, whole = false) {
  if (max <= 0) return [0];
  const raw = Math.max(max / count, whole ? 1 : 0), p = Math.pow(2, Math.floor(Math.log2(raw)));
  const step = [1, 2, 4, 8].map((m) => m * p).find((s) => s >= raw) || 8 * p;
  const out = [];
  for (let v = 0; v <= max; v += step) out.push(v);
  return out;
}

// ---- the timeline ---------------------------------------------------------------------

function stepArea(lower, upper, y) {
  // The area between two per-span series, drawn as steps.
  let d = "";
  for (let k = 0; k < F.series.count; ++k) {
    d += `${k ? "L" : "M"}${xOfSpan(k).toFixed(1)},${y(upper[k]).toFixed(1)}L${xOfSpan(k + 1).toFixed(1)},${y(upper[k]).toFixed(1)}`;
  }
  for (let k = F.series.count - 1; k >= 0; --k) {
    d += `L${xOfSpan(k + 1).toFixed(1)},${y(lower[k]).toFixed(1)}L${xOfSpan(k).toFixed(1)},${y(lower[k]).toFixed(1)}`;
  }
  return d + "Z";
}

function stepLine(values, y) {
  // A per-span series as steps; a null value (no sample yet) breaks the line.
  let d = "", on = false;
  for (let k = 0; k < F.series.count; ++k) {
    const v = values[k];
    if (v === null || v === undefined) { on = false; continue; }
    d += `${on ? "L" : "M"}${xOfSpan(k).toFixed(1)},${y(v).toFixed(1)}L${xOfSpan(k + 1).toFixed(1)},${y(v).toFixed(1)}`;
    on = true;
  }
  return d;
}

// The held layers the log carries, with their tops per span (areas stacked on the live
// bytes drawn).
function heldLayers() {
  if (!F.held) return [];
  const out = [];
  let lower = F.series.high.slice();
  for (const layer of HELD_LAYERS) {
    if (!F.held.kinds.includes(layer.key)) continue;
    const values = F.held[layer.key];
    if (layer.area) {
      const upper = lower.map((v, k) => v + (values[k] || 0));
      out.push({...layer, lower, upper, values});
      lower = upper;
    } else {
      out.push({...layer, values});
    }
  }
  return out;
}

function drawTimeline() {
  const H = 300, top = 24, bottom = 42, ph = H - top - bottom;
  const held = heldLayers();
  let top_bytes = F.peak.bytes;
  for (const l of held) {
    for (const v of (l.area ? l.upper : l.values)) if (v !== null && v > top_bytes) top_bytes = v;
  }
  const ymax = Math.max(1, top_bytes) * 1.1;
  const y = (v) => top + ph - ph * v / ymax;
  const svg = el("svg:svg", {width: W, height: H, id: "timeline"});
  const grid = el("svg:g", {class: "grid"}), axis = el("svg:g", {class: "axis"});
  for (const v of niceTicks(ymax, 5)) {
    grid.append(el("svg:line", {x1: M.left, x2: W - M.right, y1: y(v), y2: y(v)}));
    axis.append(el("svg:text", {x: M.left - 6, y: y(v) + 4, "text-anchor": "end"}, fmtBytes(v)));
  }
  const tticks = 8;
  for (let i = 0; i <= tticks; ++i) {
    const us = F.span_us * i / tticks, x = xOfTime(us);
    axis.append(el("svg:line", {x1: x, x2: x, y1: top + ph, y2: top + ph + 4}));
    const anchor = i === 0 ? "start" : i === tticks ? "end" : "middle";
    axis.append(el("svg:text", {x, y: top + ph + 16, "text-anchor": anchor}, `+${fmtDur(us)}`));
  }
  axis.append(el("svg:line", {x1: M.left, x2: W - M.right, y1: top + ph, y2: top + ph}));
  svg.append(grid);
  // Stacked areas, one per display tag, then the other tags.
  let lower = new Array(F.series.count).fill(0);
  F.series.stacks.forEach((stack, slot) => {
    if (!stack.some((v) => v > 0)) return;
    const upper = lower.map((v, k) => v + stack[k]);
    const path = el("svg:path", {d: stepArea(lower, upper, y), fill: tagColor(slot), class: "tag-area",
                                 "data-tag": tagLabel(slot)});
    path.append(el("svg:title", {}, tagLabel(slot)));
    svg.append(path);
    lower = upper;
  });
  // What the stack held beside them.
  for (const l of held) {
    const e = l.area
      ? el("svg:path", {d: stepArea(l.lower, l.upper, y), fill: l.color, opacity: 0.75, class: "held-area", "data-layer": l.key})
      : el("svg:path", {d: stepLine(l.values, y), fill: "none", stroke: l.color, "stroke-width": 1.5,
                        "stroke-dasharray": l.dash, class: "held-line", "data-layer": l.key});
    e.append(el("svg:title", {}, l.label));
    svg.append(e);
  }
  svg.append(axis);
  // The peak.
  if (F.peak.record >= 0) {
    const x = xOfTime(F.peak.time_us);
    svg.append(el("svg:line", {class: "peakline", x1: x, x2: x, y1: top - 6, y2: top + ph}));
    svg.append(el("svg:circle", {cx: x, cy: y(F.peak.bytes), r: 4, fill: "#b3261e"}));
    const right = x > W - 260;
    svg.append(el("svg:text", {id: "peak-label", x: right ? x - 8 : x + 8, y: top - 8, fill: "#b3261e",
                               "text-anchor": right ? "end" : "start", style: "fill:#b3261e;font-weight:600"},
                  `peak ${fmtBytes(F.peak.bytes)} at +${fmtDur(F.peak.time_us)}`));
  }
  // Failed allocations, under the time axis.
  const fy = top + ph + 22;
  for (const f of F.failures.shown) {
    const x = xOfTime(f[1]);
    const m = el("svg:path", {class: "failure-mark", d: `M${x},${fy}l-4,8h8z`, fill: "#b3261e"});
    m.append(el("svg:title", {}, `failed: ${fmtBytes(f[2])} on ${F.streams[f[4]].label}, ${F.tags[f[3]].label}, at +${fmtDur(f[1])}`));
    svg.append(m);
  }
  // Hover and click.
  const cursor = el("svg:line", {class: "cursor", y1: top, y2: top + ph, visibility: "hidden"});
  svg.append(cursor);
  const hit = el("svg:rect", {x: M.left, y: top, width: PW, height: ph + 30, fill: "transparent",
                              style: "cursor:crosshair"});
  svg.append(hit);
  const tip = document.getElementById("tip");
  hit.addEventListener("mousemove", (ev) => {
    const k = spanAt(ev.offsetX);
    if (k < 0) return;
    cursor.setAttribute("x1", ev.offsetX);
    cursor.setAttribute("x2", ev.offsetX);
    cursor.setAttribute("visibility", "visible");
    const lines = [`<b>${fmtBytes(F.series.high[k])}</b> live at +${fmtDur(F.series.time_us[k])} (${fmtTod(F.series.time_us[k])})`];
    F.series.stacks.forEach((s, slot) => {
      if (s[k] > 0) lines.push(`<span class="swatch" style="background:${tagColor(slot)}"></span>${tagLabel(slot)}: ${fmtBytes(s[k])}`);
    });
    if (F.held && F.held.held[k] !== null) {
      lines.push(`sampled: <b>${fmtBytes(F.held.held[k])}</b> held by the stack`);
      for (const l of held) {
        if (l.values[k] !== null) lines.push(`<span class="swatch" style="background:${l.color}"></span>${l.key === "reserved" ? "pool reserved" : l.key}: ${fmtBytes(l.values[k])}`);
      }
      if (F.held.kinds.includes("used") && F.held.used[k] !== null) lines.push(`pool used: ${fmtBytes(F.held.used[k])}`);
    }
    lines.push("click to list the blocks live then");
    tip.innerHTML = lines.join("<br>");
    tip.style.display = "block";
    tip.style.left = `${ev.pageX + 14}px`;
    tip.style.top = `${ev.pageY + 14}px`;
  });
  hit.addEventListener("mouseleave", () => { tip.style.display = "none"; cursor.setAttribute("visibility", "hidden"); });
  hit.addEventListener("click", (ev) => selectSpan(spanAt(ev.offsetX)));
  document.getElementById("chart").append(svg);
  const legend = document.getElementById("legend");
  F.series.stacks.forEach((s, slot) => {
    if (s.some((v) => v > 0)) legend.append(el("span", {}, el("i", {style: `background:${tagColor(slot)}`}), tagLabel(slot)));
  });
  for (const l of held) {
    const mark = l.area ? `background:${l.color}` : `background:none;border-top:2px ${l.dash ? "dashed" : "solid"} ${l.color};height:0;vertical-align:3px`;
    legend.append(el("span", {class: "held-legend", "data-layer": l.key}, el("i", {style: mark}), l.label));
  }
  if (!F.held) {
    legend.append(el("span", {class: "muted", id: "held-absent"},
                     "(no sample lines in the log: what the stack held beside the live bytes is not known)"));
  }
}

function drawLanes() {
  const LH = 36, lanes = document.getElementById("lanes");
  F.series.lane_streams.forEach((s, j) => {
    const data = F.series.lanes[j], ymax = Math.max(1, F.streams[s].peak);
    const y = (v) => LH - 4 - (LH - 8) * v / ymax;
    const svg = el("svg:svg", {width: W, height: LH, class: "lane", "data-stream": F.streams[s].label,
                               style: "cursor:pointer"});
    svg.append(el("svg:text", {x: M.left - 6, y: LH / 2, "text-anchor": "end"}, F.streams[s].label));
    svg.append(el("svg:text", {x: M.left - 6, y: LH / 2 + 12, "text-anchor": "end", class: "muted",
                               style: "fill:#6b7280"}, fmtBytes(F.streams[s].peak)));
    svg.append(el("svg:line", {x1: M.left, x2: W - M.right, y1: LH - 4, y2: LH - 4, stroke: "#cfd5df"}));
    svg.append(el("svg:path", {d: stepArea(new Array(data.length).fill(0), data, y), fill: "#4c78a8", opacity: 0.8}));
    for (const f of F.failures.shown) {
      if (f[4] === s) svg.append(el("svg:path", {d: `M${xOfTime(f[1])},${LH - 4}l-3,-7h6z`, fill: "#b3261e"}));
    }
    svg.addEventListener("click", (ev) => {
      setStream(s);
      selectSpan(spanAt(ev.offsetX));
    });
    lanes.append(svg);
  });
  const hidden = F.streams.length - F.series.lane_streams.length;
  document.getElementById("lanes-note").textContent =
    `live bytes of each stream's blocks (by the stream they were allocated on), the most at the peak first` +
    (hidden > 0 ? `; ${hidden} smaller streams not drawn` : "") + "; click a lane to filter by its stream";
}

// ---- the blocks live at a moment ------------------------------------------------------

async function decodeBlocks() {
  const text = document.getElementById("memviz-blocks").textContent.trim();
  const bin = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream("gzip"));
  const raw = JSON.parse(await new Response(stream).text());
  const n = raw.start.length;
  const b = {n, start: new Float64Array(n), end: new Float64Array(n), time: new Float64Array(n),
             kind: Int32Array.from(raw.kind), kinds: raw.kinds, ptr: raw.ptr};
  let s = 0, t = 0;
  for (let i = 0; i < n; ++i) {
    s += raw.start[i];
    t += raw.time[i];
    b.start[i] = s;
    b.time[i] = t;
    b.end[i] = raw.life[i] === 0 ? Infinity : s + raw.life[i];
  }
  return b;
}

function liveAt(record) {
  // Blocks are in start order: scan those started by `record`.
  const out = [];
  for (let i = 0; i < blocks.n && blocks.start[i] <= record; ++i) {
    if (blocks.end[i] > record) {
      const k = blocks.kinds[blocks.kind[i]];
      if (streamFilter < 0 || k[2] === streamFilter) out.push(i);
    }
  }
  const size = (i) => blocks.kinds[blocks.kind[i]][0];
  out.sort((a, c) => size(c) - size(a) || blocks.start[a] - blocks.start[c]);
  return out;
}

function select(record, time_us, label) {
  selected = {record, time_us, label};
  renderLive();
}

// A span of the timeline: its highest moment. The address keeps it (#span=K), so a link
// or a reload shows the same moment.
function selectSpan(k) {
  if (k < 0 || k >= F.series.count) return;
  select(F.series.record[k], F.series.time_us[k], `+${fmtDur(F.series.time_us[k])}`);
  history.replaceState(null, "", `#span=${k}`);
}

function renderLive() {
  if (!blocks || !selected) return;
  const {record, time_us, label} = selected;
  const live = liveAt(record);
  let total = 0;
  for (const i of live) total += blocks.kinds[blocks.kind[i]][0];
  const title = document.getElementById("live-title");
  title.textContent = `Blocks live at ${label} (${fmtTod(time_us)})` +
    (streamFilter >= 0 ? ` on ${F.streams[streamFilter].label}` : "");
  title.dataset.record = record;
  document.getElementById("live-note").textContent =
    `${live.length} blocks, ${fmtBytes(total)} (${total} bytes), largest first; age is the time since the allocate`;
  const body = document.querySelector("#live-blocks tbody");
  body.replaceChildren();
  live.slice(0, LIST_ROWS).forEach((i, r) => {
    const [size, tag, stream, thread] = blocks.kinds[blocks.kind[i]];
    const tr = el("tr", {"data-ptr": `0x${blocks.ptr[i]}`, "data-bytes": size, "data-tag": F.tags[tag].label,
                         "data-stream": F.streams[stream].label},
                  el("td", {}, String(r + 1)), el("td", {title: `${size} bytes`}, fmtBytes(size)),
                  el("td", {class: "l"}, F.tags[tag].label), el("td", {class: "l"}, F.streams[stream].label),
                  el("td", {class: "l"}, F.threads[thread]), el("td", {}, fmtDur(time_us - blocks.time[i])),
                  el("td", {class: "l"}, `0x${blocks.ptr[i]}`));
    body.append(tr);
  });
  if (live.length > LIST_ROWS) {
    let rest = 0;
    for (const i of live.slice(LIST_ROWS)) rest += blocks.kinds[blocks.kind[i]][0];
    body.append(el("tr", {class: "more"}, el("td", {colspan: 7, class: "l"},
                                             `… and ${live.length - LIST_ROWS} smaller blocks, ${fmtBytes(rest)}`)));
  }
}

function setStream(s) {
  streamFilter = s;
  document.getElementById("stream-filter").value = String(s);
  document.querySelectorAll("svg.lane").forEach((e) => {
    e.style.opacity = s < 0 || e.dataset.stream === F.streams[s].label ? 1 : 0.35;
  });
  renderLive();
}

// ---- tables ---------------------------------------------------------------------------

function table(id, head, rows) {
  const t = document.getElementById(id);
  t.append(el("thead", {}, el("tr", {}, ...head.map(([h, left]) => el("th", left ? {class: "l"} : {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(r);
  t.append(body);
}

function drawTables() {
  const tags = F.tags.map((g, i) => i).sort((a, b) => F.tags[b].at_peak - F.tags[a].at_peak || F.tags[b].bytes - F.tags[a].bytes);
  const rows = tags.slice(0, TABLE_ROWS).map((i) => {
    const g = F.tags[i];
    return el("tr", {"data-tag": g.label}, el("td", {class: "l"}, g.label), el("td", {}, String(g.allocations)),
              el("td", {title: `${g.bytes} bytes`}, fmtBytes(g.bytes)), el("td", {}, fmtBytes(g.peak)),
              el("td", {title: `${g.at_peak} bytes`}, fmtBytes(g.at_peak)), el("td", {}, fmtBytes(g.live)),
              el("td", g.failures ? {class: "bad"} : {}, String(g.failures)));
  });
  if (tags.length > TABLE_ROWS) rows.push(el("tr", {class: "more"}, el("td", {colspan: 7, class: "l"}, `… and ${tags.length - TABLE_ROWS} more tags`)));
  table("tag-totals", [["tag", 1], ["allocations"], ["allocated"], ["own peak"], ["at the peak"], ["live at end"], ["failed"]], rows);

  document.getElementById("failure-count").textContent = F.failures.count
    ? `${F.failures.count}` + (F.failures.count > F.failures.shown.length ? ` (the first ${F.failures.shown.length} are embedded)` : "")
    : "none";
  table("failures", [["time"], ["size"], ["tag", 1], ["stream", 1], ["thread", 1]],
        F.failures.shown.slice(0, TABLE_ROWS).map((f) => el("tr", {"data-bytes": f[2]},
          el("td", {}, `+${fmtDur(f[1])}`), el("td", {title: `${f[2]} bytes`}, fmtBytes(f[2])),
          el("td", {class: "l"}, F.tags[f[3]].label), el("td", {class: "l"}, F.streams[f[4]].label),
          el("td", {class: "l"}, F.threads[f[5]]))));

  document.getElementById("skipped-count").textContent = F.skipped ? String(F.skipped) : "none";
  const probs = document.getElementById("problems");
  for (const p of F.problems) probs.append(el("div", {class: "problem"}, `line ${p.line}: ${p.message}`));
  if (F.skipped > F.problems.length) probs.append(el("div", {}, `… and ${F.skipped - F.problems.length} more`));
}

function drawHistogram() {
  const H = 200, top = 10, bottom = 64, left = 56, bw = 26;
  const bins = F.histogram, cmax = Math.max(1, ...bins.map((b) => b[2]));
  const svg = el("svg:svg", {width: left + bins.length * bw + 40, height: H, id: "size-histogram"});
  const y = (v) => top + (H - top - bottom) * (1 - v / cmax);
  for (const v of niceTicks(cmax, 4, true)) {
    svg.append(el("svg:text", {x: left - 6, y: y(v) + 4, "text-anchor": "end"}, String(v)));
  }
  bins.forEach(([lo, hi, count, bytes], i) => {
    const x = left + i * bw;
    const r = el("svg:rect", {x: x + 2, y: y(count), width: bw - 4, height: H - bottom - y(count), fill: "#4c78a8",
                              class: "bin", "data-count": count});
    r.append(el("svg:title", {}, `${fmtBytes(lo)} – ${fmtBytes(hi)}: ${count} allocations, ${fmtBytes(bytes)}`));
    svg.append(r);
    svg.append(el("svg:text", {transform: `translate(${x + bw / 2 - 3},${H - bottom + 10}) rotate(50)`}, fmtBytes(lo)));
  });
  document.getElementById("histogram").append(svg);
}

function drawSummary() {
  const s = document.getElementById("summary");
  const topTags = F.tags.map((g) => g).filter((g) => g.at_peak > 0).sort((a, b) => b.at_peak - a.at_peak).slice(0, 3);
  s.innerHTML = "";
  s.append(el("b", {id: "record-count", "data-count": F.records}, `${F.records}`), " records over ",
           `${fmtDur(F.span_us)} (from ${fmtTod(0)}), `,
           el("b", {id: "tag-count", "data-count": F.tags.length}, `${F.tags.length} tags`), ", ",
           `${F.streams.length} streams, ${F.threads.length} threads. Peak `,
           el("b", {id: "peak-bytes", "data-bytes": F.peak.bytes, title: `${F.peak.bytes} bytes`}, fmtBytes(F.peak.bytes)),
           ` in ${F.peak.blocks} blocks at +${fmtDur(F.peak.time_us)} (log line ${F.peak.line})` +
           (topTags.length ? `: ${topTags.map((g) => `${g.label} ${fmtBytes(g.at_peak)}`).join(", ")}` : "") +
           `. Live at the end: ${fmtBytes(F.end.bytes)} in ${F.end.blocks} blocks. `,
           el("span", {id: "failure-total", "data-count": F.failures.count, class: F.failures.count ? "bad" : ""},
              `${F.failures.count} failed allocations`),
           F.skipped ? el("span", {class: "bad"}, `, ${F.skipped} malformed lines skipped`) : "", ".");
  const h = F.held;
  if (h && h.kinds.includes("held")) {
    const parts = [`live ${fmtBytes(h.peak_live)}`];
    if (h.peak_cached !== null) parts.push(`cached ${fmtBytes(h.peak_cached)}`);
    if (h.peak_queued !== null) parts.push(`queued frees ${fmtBytes(h.peak_queued)}`);
    const rest = h.peak - h.peak_live - (h.peak_cached || 0) - (h.peak_queued || 0);
    if (rest) parts.push(`other ${fmtBytes(rest)}`);
    s.append(el("div", {}, "The stack held at most ",
                el("b", {id: "held-peak", "data-bytes": h.peak, title: `${h.peak} bytes`}, fmtBytes(h.peak)),
                ` at +${fmtDur(h.peak_time_us)} (log line ${h.peak_line}): ${parts.join(" + ")}; held/live `,
                el("b", {id: "held-ratio"}, h.ratio === null ? "–" : h.ratio.toFixed(3)),
                " (peak held over peak live)" +
                (h.reserved_peak !== null ? `; the pools reserved at most ${fmtBytes(h.reserved_peak)}` : "") +
                `; ${h.points} sample${h.points === 1 ? "" : "s"}.`));
  }
  const odd = [];
  if (F.odd.unmatched_frees) odd.push(`${F.odd.unmatched_frees} frees of addresses not live in the log`);
  if (F.odd.reused_live) odd.push(`${F.odd.reused_live} allocations of an address still live`);
  if (F.odd.refused_frees) odd.push(`${F.odd.refused_frees} refused frees`);
  if (odd.length) s.append(el("div", {class: "muted"}, `Also: ${odd.join("; ")}.`));
}

// ---- start ----------------------------------------------------------------------------

async function main() {
  drawSummary();
  drawTimeline();
  drawLanes();
  drawTables();
  drawHistogram();
  const filter = document.getElementById("stream-filter");
  F.streams.forEach((g, i) => filter.append(el("option", {value: String(i)}, g.label)));
  filter.addEventListener("change", () => setStream(Number(filter.value)));
  const toPeak = () => select(F.peak.record, F.peak.time_us, "the peak");
  document.getElementById("to-peak").addEventListener("click", () => {
    toPeak();
    history.replaceState(null, "", "#");
  });
  blocks = await decodeBlocks();
  const asked = /^#span=(\d+)$/.exec(location.hash);
  if (asked && Number(asked[1]) < F.series.count) {
    selectSpan(Number(asked[1]));
  } else {
    toPeak();
  }
  document.documentElement.dataset.memviz = "ready";
}

main().catch((e) => {
  document.documentElement.dataset.memviz = "error";
  document.getElementById("summary").prepend(el("div", {class: "bad", id: "page-error"}, `The page failed: ${e}`));
});
