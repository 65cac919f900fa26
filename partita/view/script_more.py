"""The view page's JavaScript for the rank-vs-single-device comparison, memory over the step
and the measured bubble (loaded after ``script.SCRIPT``; vanilla, no network request)."""

SCRIPT_MORE = r"""
// ---------- single device beside a rank's program ----------
function markCompare(P) {
  // added (right) and gone (left) nodes outlined red, resized ones orange
  const C = P.compare;
  P.local.changed = C.local_mark.map(m => m === 1 ? 1 : 0);
  P.local.resized = C.local_mark.map(m => m === 2 ? 1 : 0);
  P.global.changed = C.global_mark.map(m => m === 3 ? 1 : 0);
  P.global.resized = C.global_mark.map(m => m === 2 ? 1 : 0);
}
function linkCompare(root, P, gv, lv, side) {
  const C = P.compare, cnt = C.counts, keys = Object.keys(cnt).sort();
  root.insertBefore(el("div", {class: "summary", id: "compare-summary"},
    "single-device graph (left) beside the per-rank program (right), nodes matched by module, source line and op: " +
    (keys.length ? keys.map(k => `${cnt[k]} ${k}`).join(", ") : "no differences") +
    ". Red outline: added by the rewrite (right) or gone (left); orange: the rank's shape differs from the global one. " +
    "Clicking a node selects its match on the other side."), side);
  let busy = false;
  const go = (view, j) => { if (busy || j < 0) return; busy = true; try { view.reveal(j); } finally { busy = false; } };
  const nm = (g, i) => "%" + ((g.name[i] || "?").split(" ")[0]) + " : " + g.type[i];
  gv.onSelect = i => go(lv, C.global_match[i]);
  lv.onSelect = j => go(gv, C.local_match[j]);
  gv.extra = i => {
    const j = C.global_match[i];
    if (j < 0) return [["per-rank program", "gone: no node of this module and op is left (the rewrite replaced it)"]];
    return [["per-rank program", nm(lv.g, j) + (C.global_mark[i] === 2 ? "  (the rank's piece; global " + gv.g.type[i] + ")" : "")]];
  };
  lv.extra = j => {
    const i = C.local_match[j];
    if (i < 0) return [["single device", "added by the rewrite (" + (C.kinds[lv.g.ops[lv.g.op[j]]] || "other") + ")"]];
    return [["single device", nm(gv.g, i) + (C.local_mark[j] === 2 ? "  (global shape; this rank " + lv.g.type[j] + ")" : "")]];
  };
}
function compareTest(V, out) {
  // select an added collective, a resized node and a single-device node; read the two sides back
  const C = V.P.compare, lv = V.lv, gv = V.gv, g = lv.g;
  out.summary = document.getElementById("compare-summary").textContent;
  const added = C.local_mark.findIndex((m, j) => m === 1 && C.kinds[g.ops[g.op[j]]] === "collective");
  if (added >= 0) { lv.reveal(added); out.addedDetail = lv.detail.textContent; out.addedOp = g.ops[g.op[added]];
    out.addedGroup = lv.groups[lv.nodeGroup[added]].id; }
  const loose = lv.groups.find(c => c.id === "(no scope)");
  out.noScope = loose ? loose.nodes.length : 0;
  const rs = C.local_mark.findIndex(m => m === 2);
  if (rs >= 0) { lv.reveal(rs); out.resizedLeftSel = gv.sel === C.local_match[rs]; out.resizedDetail = lv.detail.textContent;
    out.resizedLeftDetail = gv.detail.textContent; }
  const gi = C.global_match.findIndex(j => j >= 0);
  gv.reveal(gi); out.rightSel = lv.sel === C.global_match[gi];
  out.markedLeft = document.querySelectorAll(".side:first-child g.changed, .side:first-child g.resized").length;
  out.markedRight = document.querySelectorAll(".side:last-child g.changed, .side:last-child g.resized").length;
}

// ---------- memory over the step ----------
const MCOL = {"params": "#6b9bd1", "optimizer state": "#b58fd0", "batch": "#c8c870", "constants": "#aaa",
              "gradients": "#7fbf7f", "activations": "#e0a050", "communication": "#d07f7f"};
function memoryCurveView(root, M) {
  if (!M.ranks.length) { root.append(el("div", {class: "warn", id: "memory-note"}, "memory over the step: " + M.note)); return {peaks: []}; }
  root.append(el("div", {class: "summary"}, "memory over the step per rank: what its program holds after each node, in " +
    "program order, stacked by kind; alike ranks once with their count; the peak marked (the one memory_report gives)" +
    (M.note ? "; " + M.note : "")));
  const lg = el("div", {class: "mlegend"});
  for (const c of M.categories) { const s = el("span"); s.append(el("i", {style: "background:" + MCOL[c]}), " " + c); lg.append(s); }
  root.append(lg);
  const peaks = [], max = Math.max(...M.ranks.map(r => r.peak)) || 1, W = 1000, H = 150, LX = 70;
  for (const r of M.ranks) {
    const box = el("div", {class: "mcurve", "data-rank": r.rank});
    box.append(el("b", {}, `rank ${r.rank}${r.count > 1 ? " \u00D7" + r.count : ""}: peak ${fmtBytes(r.peak)} at ` +
      `${r.peak_node}${r.peak_scope ? " in " + r.peak_scope : ""} (node ${r.peak_x} of ${r.n})`));
    const svg = sv("svg", {width: LX + W + 10, height: H + 30});
    const X = x => LX + x / Math.max(1, r.n) * W, Y = b => H + 4 - b / max * H, k = r.x.length;
    const acc = new Float64Array(k);
    for (const c of M.categories) {
      const vals = c in r.base ? new Array(k).fill(r.base[c]) : r.cols[c];
      if (!vals || !vals.some(v => v > 0)) continue;
      const lower = Array.from(acc), pts = [];
      for (let q = 0; q < k; q++) acc[q] += vals[q];
      for (let q = 0; q < k; q++) pts.push(X(r.x[q]).toFixed(1) + "," + Y(acc[q]).toFixed(1));
      for (let q = k - 1; q >= 0; q--) pts.push(X(r.x[q]).toFixed(1) + "," + Y(lower[q]).toFixed(1));
      const pg = sv("polygon", {points: pts.join(" "), fill: MCOL[c] || "#888", class: "marea", "data-cat": c});
      pg.append(sv("title", {}, c)); svg.append(pg);
    }
    peaks.push(acc.reduce((a, b) => Math.max(a, b), 0));
    const px = X(r.peak_x);
    svg.append(sv("line", {x1: px, x2: px, y1: 4, y2: H + 4, class: "mpeak"}));
    svg.append(sv("text", {x: Math.min(px + 3, LX + W - 110), y: 14, class: "mpeaktext"}, "peak " + fmtBytes(r.peak)));
    svg.append(sv("text", {x: 2, y: Y(max) + 10}, fmtBytes(max)), sv("text", {x: 2, y: H + 4}, "0"));
    svg.append(sv("text", {x: LX, y: H + 22}, "node 0"), sv("text", {x: LX + W - 70, y: H + 22}, "node " + r.n));
    box.append(svg); root.append(box);
  }
  return {peaks, ranks: M.ranks.map(r => [r.rank, r.count])};
}

// ---------- the measured bubble under the predicted schedule ----------
function measuredRows(M, nb, end, U, draw) {
  // one bar per pp rank: its measured busy time, then its time waiting in recv; the slowest
  // rank's step is drawn as long as the predicted schedule
  const span = Math.max(...M.per_rank.map(m => m.step)) || 1, s = end * U / span;
  draw(4, 30 + nb * 34 + 4, 0, 0, "", "measured in a run (per rank: busy, then waiting in recv; not per F/B)");
  M.per_rank.forEach((m, p) => {
    const y = 30 + (nb + 1 + p) * 34, busy = Math.max(0, m.step - m.recv);
    draw(4, y, 0, 0, "", "pp " + p + " run");
    draw(80, y, busy * s, 26, "#6b9bd1", `pp ${p} measured: busy ${(busy * 1e3).toFixed(2)} ms of ${(m.step * 1e3).toFixed(2)} ms`);
    draw(80 + busy * s, y, m.recv * s, 26, "#e05050", `pp ${p} measured: waiting in recv ${(m.recv * 1e3).toFixed(2)} ms`);
  });
}
"""
