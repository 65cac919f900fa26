"""The view page's JavaScript (vanilla, no library, no network request)."""

SCRIPT = r"""
"use strict";
// partita view: one page, no network. Reads the JSON blob in #pdata and draws the graph,
// parallel, schedule and timeline views. A URL fragment #test=... runs an in-page self-test
// and writes its result into #test-result (the browser tests read the DOM).
const ERRORS = [];
window.onerror = (msg, src, line) => { ERRORS.push(String(msg) + " at " + line); showErrors(); };
const origError = console.error;
console.error = (...a) => { ERRORS.push(a.map(String).join(" ")); showErrors(); origError.apply(console, a); };
function showErrors() { const e = document.getElementById("errors"); if (e) e.textContent = ERRORS.join("\n"); }
const SVGNS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function sv(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmtBytes(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : String(b)) + " " + u[i];
}
const isNum = s => /^[0-9]+$/.test(s);
function fmtNum(x) {
  const u = ["", "k", "M", "G", "T", "P"]; let i = 0;
  while (Math.abs(x) >= 1000 && i < u.length - 1) { x /= 1000; i++; }
  return (i ? x.toFixed(2) : String(x)) + u[i];
}

// ---------- graph view ----------
function splitLines(g) {
  // each node's value names (space-separated, no %) and result types, read from its .pir line
  g.name = new Array(g.n); g.type = new Array(g.n);
  for (let i = 0; i < g.n; i++) {
    const ln = g.line[i], eq = ln.indexOf(" = "), paren = ln.indexOf("(");
    g.name[i] = eq > 0 && (paren < 0 || eq < paren) ? ln.slice(0, eq).split(", ").map(x => x.replace(/^%/, "")).join(" ") : "";
    const colon = ln.lastIndexOf(" : ");
    g.type[i] = colon > 0 ? ln.slice(colon + 3) : "";
  }
}
const BW = 150, BH = 30, GX = 24, GY = 26, MAXW = 6;
class GraphView {
  constructor(root, g, mesh) {
    this.g = g; this.mesh = mesh; this.root = root; this.sel = -1;
    if (g.detail && !g.name) splitLines(g);
    this.buildTree(); this.buildDom(); this.initialExpand(); this.relayout();
  }
  buildTree() {
    const g = this.g, groups = [{id: "", name: "", parent: -1, kids: [], nodes: [], first: 1e18, count: 0}];
    const byId = new Map([["", 0]]);
    const getGroup = path => {
      if (byId.has(path)) return byId.get(path);
      const cut = path.lastIndexOf("."), par = getGroup(cut < 0 ? "" : path.slice(0, cut));
      const id = groups.length;
      groups.push({id: path, name: path.slice(cut + 1), parent: par, kids: [], nodes: [], first: 1e18, count: 0});
      groups[par].kids.push(id); byId.set(path, id); return id;
    };
    const loose = []; let noScope = -1;
    const scopeGroup = g.scopes.map(s => s ? getGroup(s) : -1);
    const shownIn = g.shown_in || {};
    const groupScope = i => { const s = g.scope[i]; return g.scopes[s] ? s : (shownIn[i] ?? s); };
    for (let i = 0; i < g.n; i++) { const s = scopeGroup[groupScope(i)]; if (s < 0) loose.push(i); }
    if (loose.length > 8) { noScope = getGroup("(no scope)"); }
    this.nodeGroup = new Int32Array(g.n);
    for (let i = 0; i < g.n; i++) {
      let s = scopeGroup[groupScope(i)]; if (s < 0) s = noScope < 0 ? 0 : noScope;
      this.nodeGroup[i] = s; groups[s].nodes.push(i);
      for (let q = s; q >= 0; q = groups[q].parent) { groups[q].count++; if (i < groups[q].first) groups[q].first = i; }
    }
    this.groups = groups; this.expanded = new Uint8Array(groups.length); this.expanded[0] = 1;
  }
  initialExpand() {
    // Collapsed to layers: expand module groups breadth first while the view stays small,
    // never a layer (a group named by a number) and never a group's own ops.
    const q = [0]; let visible = this.groups[0].kids.length + this.groups[0].nodes.length;
    while (q.length) {
      const gi = q.shift();
      for (const k of this.groups[gi].kids) {
        const c = this.groups[k];
        if (isNum(c.name) || c.name === "(no scope)" || (c.nodes.length > 8 && !c.kids.length)) continue;
        const more = c.kids.length + c.nodes.length - 1;
        if (visible + more > 200) continue;
        this.expanded[k] = 1; visible += more; q.push(k);
      }
    }
  }
  buildDom() {
    const r = this.root; r.classList.add("gview");
    const bar = el("div", {class: "gbar"});
    this.search = el("input", {type: "search", placeholder: "search value, op or module", class: "gsearch"});
    this.search.addEventListener("input", () => this.runSearch(this.search.value));
    this.info = el("span", {class: "ginfo"});
    const reset = el("button", {class: "greset"}, "layers");
    reset.title = "collapse every module back to its layers";
    reset.addEventListener("click", () => { this.expanded.fill(0); this.expanded[0] = 1; this.initialExpand(); this.relayout(); });
    bar.append(el("b", {}, this.g.title), " ", this.search, reset, this.info);
    this.results = el("div", {class: "gresults"});
    this.scroll = el("div", {class: "gscroll"});
    this.svg = sv("svg", {class: "gsvg"});
    this.scroll.append(this.svg);
    this.detail = el("div", {class: "gdetail"}, "click a node for its .pir line, types, placement and source");
    r.append(bar, this.results, this.scroll, this.detail);
    if (!this.g.detail) r.insertBefore(el("div", {class: "warn", id: "too-large"},
      `this graph has ${this.g.n} nodes, over the detailed view's limit of ${this.g.detail_limit}: ` +
      "showing its layers only (each group's ops as one box)"), bar);
    this.scroll.addEventListener("scroll", () => this.schedule());
  }
  schedule() { if (!this.pending) { this.pending = true; requestAnimationFrame(() => { this.pending = false; this.draw(); }); } }
  topCollapsed(gi) {
    let top = -1;
    for (let q = gi; q > 0; q = this.groups[q].parent) if (!this.expanded[q]) top = q;
    return top;
  }
  relayout() {
    const G = this.groups, g = this.g, n = g.n;
    const rep = new Int32Array(G.length);
    for (let i = 0; i < G.length; i++) rep[i] = this.topCollapsed(i);
    // items: [kind, id, first]; kind 0 node, 1 group, 2 a group's own ops (layer view)
    const items = [], itemOf = new Int32Array(n), seen = new Map();
    for (let i = 0; i < n; i++) {
      const gi = this.nodeGroup[i], r = rep[gi];
      let key, kind, id;
      if (r >= 0) { key = "g" + r; kind = 1; id = r; }
      else if (!g.detail) { key = "o" + gi; kind = 2; id = gi; }
      else { key = null; kind = 0; id = i; }
      if (key === null) { itemOf[i] = items.length; items.push([0, i, i]); continue; }
      let it = seen.get(key);
      if (it === undefined) { it = items.length; seen.set(key, it); items.push([kind, id, i]); }
      itemOf[i] = it;
    }
    const edges = new Map();
    for (let i = 0; i < n; i++) {
      const b = itemOf[i];
      for (const j of g.in[i]) { const a = itemOf[j]; if (a !== b && a < b) edges.set(a * 1048576 + b, [a, b]); }
    }
    const rank = new Int32Array(items.length), inE = items.map(() => []);
    for (const [a, b] of edges.values()) inE[b].push(a);
    const occ = [], X = new Int32Array(items.length);
    for (let b = 0; b < items.length; b++) {
      let r = 0; for (const a of inE[b]) if (rank[a] + 1 > r) r = rank[a] + 1;
      while ((occ[r] || 0) >= MAXW) r++;
      rank[b] = r; X[b] = occ[r] || 0; occ[r] = X[b] + 1;
    }
    this.items = items; this.itemOf = itemOf; this.edges = [...edges.values()]; this.rank = rank; this.X = X;
    const height = (occ.length + 1) * (BH + GY), width = MAXW * (BW + GX) + GX;
    this.svg.setAttribute("width", width); this.svg.setAttribute("height", height);
    this.info.textContent = ` ${n} nodes, ${items.length} boxes shown`;
    this.draw();
  }
  pos(it) { return [GX + this.X[it] * (BW + GX), GY / 2 + this.rank[it] * (BH + GY)]; }
  label(it) {
    const [kind, id] = this.items[it], g = this.g;
    if (kind === 0) { const nm = g.name ? g.name[id] : ""; return (nm ? "%" + nm.split(" ")[0] + " = " : "") + g.ops[g.op[id]]; }
    const G = this.groups[id];
    if (kind === 2) return (G.id || "(top)") + ": " + G.nodes.length + " ops";
    return "\u25B8 " + G.id + " (" + G.count + ")";
  }
  shortLabel(it, t) {
    // what fits a box (21 characters of 11px monospace): a collapsed group keeps its path's
    // end and its count (h.11.attn.c_proj is told apart from h.1.attn.c_proj), a node its start
    if (t.length <= 21) return t;
    const [kind, id] = this.items[it];
    if (kind !== 1) return t.slice(0, 20) + "\u2026";
    const G = this.groups[id], tail = " (" + G.count + ")", room = 21 - 3 - tail.length;
    let end = G.id.slice(Math.max(0, G.id.length - room));
    const dot = end.indexOf(".");
    if (dot >= 0 && dot < end.length - 1) end = end.slice(dot + 1);   // whole path parts where one fits
    return "\u25B8 \u2026" + end + tail;
  }
  draw() {
    const top = this.scroll.scrollTop - 400, bot = this.scroll.scrollTop + this.scroll.clientHeight + 400;
    const svg = this.svg; svg.textContent = "";
    const inWin = y => y + BH >= top && y <= bot;
    const eg = sv("g", {class: "edges"}); svg.append(eg);
    for (const [a, b] of this.edges) {
      const [xa, ya] = this.pos(a), [xb, yb] = this.pos(b);
      if (Math.max(ya, yb) < top || Math.min(ya, yb) > bot) continue;
      const x1 = xa + BW / 2, y1 = ya + BH, x2 = xb + BW / 2, y2 = yb, m = (y1 + y2) / 2;
      eg.append(sv("path", {d: `M${x1},${y1} C${x1},${m} ${x2},${m} ${x2},${y2}`}));
    }
    for (let it = 0; it < this.items.length; it++) {
      const [x, y] = this.pos(it);
      if (!inWin(y)) continue;
      const [kind, id] = this.items[it];
      const ch = this.g.changed, chg = ch && (kind === 0 ? ch[id] : this.groupChanged(id));
      const cls = (kind === 0 ? "node" + (id === this.sel ? " sel" : "") + (this.g.rc && this.g.rc[id] ? " rc" : "") +
        (this.g.resized && this.g.resized[id] ? " resized" : "") : "group") + (chg ? " changed" : "");
      const gr = sv("g", {class: cls, transform: `translate(${x},${y})`, "data-item": it});
      gr.append(sv("rect", {width: BW, height: BH, rx: kind ? 8 : 3}));
      const t = this.label(it);
      gr.append(sv("text", {x: 6, y: 19}, this.shortLabel(it, t)));
      gr.append(sv("title", {}, t));
      gr.addEventListener("click", () => this.clickItem(it));
      svg.append(gr);
    }
  }
  groupChanged(gi) {
    // a collapsed group is marked when any node under it changed (counted once per group)
    if (!this.changedIn) {
      this.changedIn = new Int32Array(this.groups.length);
      for (let i = 0; i < this.g.n; i++) if (this.g.changed[i]) for (let q = this.nodeGroup[i]; q >= 0; q = this.groups[q].parent) this.changedIn[q]++;
    }
    return this.changedIn[gi];
  }
  clickItem(it) {
    const [kind, id] = this.items[it];
    if (kind === 0) { this.select(id); return; }
    if (kind === 1) { this.expanded[id] = 1; this.relayout(); }
  }
  reveal(i) {
    for (let q = this.nodeGroup[i]; q > 0; q = this.groups[q].parent) this.expanded[q] = 1;
    this.relayout();
    const [, y] = this.pos(this.itemOf[i]);
    this.scroll.scrollTop = Math.max(0, y - this.scroll.clientHeight / 3);
    if (this.g.detail) this.select(i);
  }
  select(i) {
    this.sel = i; const g = this.g, d = this.detail; d.textContent = "";
    const sc = g.scopes[g.scope[i]], loc = g.file[i] >= 0 ?
      ` loc("${g.files[g.file[i]]}":${g.lineno[i]}${sc ? ` in "${sc}"` : ""}${g.rc[i] ? ` recompute "${g.rc[i]}"` : ""})` : "";
    d.append(el("pre", {class: "pirline"}, g.line[i] + loc));
    const rows = [["type", g.type[i]], ["op", g.ops[g.op[i]]], ["module", g.scopes[g.scope[i]] ||
      (g.shown_in && g.shown_in[i] !== undefined ? `(none; drawn in ${g.scopes[g.shown_in[i]]}, the module of the value it moves)` : "(none)")],
      ["source", g.file[i] >= 0 ? g.files[g.file[i]] + ":" + g.lineno[i] : "(unknown)"]];
    if (g.rc[i]) rows.push(["recomputed", g.rc[i]]);
    if (this.extra) rows.push(...this.extra(i));
    if (g.flops && (g.flops[i] || g.bytes[i])) rows.push(["cost", fmtNum(g.flops[i]) + " FLOPs, " + fmtBytes(g.bytes[i]) + " moved"]);
    const ins = g.in[i].map(j => "%" + (g.name[j] || "?").split(" ")[0]).join(", ");
    if (ins) rows.push(["operands from", ins]);
    const t = el("table", {class: "kv"});
    for (const [k, v] of rows) { const tr = el("tr"); tr.append(el("th", {}, k), el("td", {}, v)); t.append(tr); }
    d.append(t);
    const gi = this.nodeGroup[i];
    if (gi > 0) {
      const c = el("button", {class: "gcollapse"}, "collapse " + this.groups[gi].id);
      c.addEventListener("click", () => { this.expanded[gi] = 0; this.sel = -1; this.relayout(); });
      d.append(c);
    }
    const p = g.placements && g.placements[String(i)];
    if (p && this.mesh) d.append(drawPlacement(this.mesh, p, g.type[i]));
    this.draw();
    if (this.onSelect) this.onSelect(i);
  }
  borrowed(i) {
    // the module a node without one is drawn in (that of the value it moves), or ""
    const g = this.g, s = g.shown_in && g.shown_in[i];
    return s === undefined || g.scopes[g.scope[i]] ? "" : g.scopes[s];
  }
  find(q) {
    q = q.trim().toLowerCase(); const g = this.g, out = [];
    if (!q) return out;
    for (let i = 0; i < g.n && out.length < 200; i++) {
      const nm = g.name ? g.name[i].toLowerCase() : "";
      if (nm.split(" ").includes(q.replace(/^%/, "")) || g.ops[g.op[i]].toLowerCase() === q ||
          (g.scopes[g.scope[i]] || "").toLowerCase().includes(q) || this.borrowed(i).toLowerCase().includes(q) || (nm && nm.includes(q.replace(/^%/, "")))) out.push(i);
    }
    return out;
  }
  runSearch(q) {
    const hits = this.find(q), r = this.results; r.textContent = "";
    if (!q.trim()) return hits;
    r.append(el("div", {class: "count"}, hits.length >= 200 ? "first 200 matches" : hits.length + " matches"));
    for (const i of hits.slice(0, 200)) {
      const g = this.g;
      const a = el("a", {href: "javascript:void 0", class: "hit"},
        (g.name && g.name[i] ? "%" + g.name[i].split(" ")[0] + " " : "") + g.ops[g.op[i]] + "  " + (g.scopes[g.scope[i]] || this.borrowed(i)));
      a.addEventListener("click", () => this.reveal(i)); r.append(a);
    }
    return hits;
  }
}

// ---------- placement on the mesh ----------
function parsePlacementText(s) {
  // "[dp, -, tp] partial(tp)" or "replicated"
  const m = /^\[([^\]]*)\](?:\s*partial\(([^)]*)\))?/.exec(s.trim());
  if (!m) return {dims: [], partial: []};
  const dims = m[1].split(",").map(x => x.trim()).map(x => x === "-" || !x ? [] : x.split("@"));
  return {dims, partial: m[2] ? m[2].split(",").map(x => x.trim()) : []};
}
function shardOf(mesh, p, coords) {
  const ix = n => mesh.names.indexOf(n), sz = n => mesh.shape[ix(n)];
  return p.dims.map(axes => { let k = 0; for (const a of axes) k = k * sz(a) + coords[ix(a)]; return axes.length ? k : -1; });
}
function drawPlacement(mesh, p, type) {
  const box = el("div", {class: "placement"});
  const split = p.dims.some(a => a.length);
  box.append(el("div", {class: "ptitle"}, (type ? type + ": " : "") + (split ? "each rank's shard (index per split dim)" : "every rank holds it whole") +
    (p.partial.length ? "; \u03A3 = a partial sum over " + p.partial.join(", ") : "")));
  const nd = mesh.shape.length, inner = Math.min(2, nd), outer = nd - inner;
  const outerShape = mesh.shape.slice(0, outer), nOuter = outerShape.reduce((a, b) => a * b, 1);
  const rows = inner === 2 ? mesh.shape[nd - 2] : 1, cols = mesh.shape[nd - 1];
  const wrap = el("div", {class: "pgrids"});
  let rank = 0;
  for (let o = 0; o < nOuter; o++) {
    const oc = []; let t = o; for (let k = outer - 1; k >= 0; k--) { oc.unshift(t % outerShape[k]); t = Math.floor(t / outerShape[k]); }
    const grid = el("div", {class: "pgrid"});
    if (outer) grid.append(el("div", {class: "plabel"}, oc.map((c, k) => mesh.names[k] + "=" + c).join(" ")));
    const tbl = el("table");
    for (let r = 0; r < rows; r++) {
      const tr = el("tr");
      for (let c = 0; c < cols; c++) {
        const coords = inner === 2 ? [...oc, r, c] : [...oc, c];
        const sh = shardOf(mesh, p, coords), lin = sh.reduce((a, b) => a * 7 + Math.max(b, 0), 0);
        const td = el("td", {class: "rank" + (p.partial.length ? " partial" : ""), "data-rank": rank,
          style: split ? `background:hsl(${(lin * 67) % 360},60%,82%)` : ""});
        td.append(el("div", {class: "rk"}, "r" + rank), el("div", {}, split ? "[" + sh.map(x => x < 0 ? ":" : x).join(",") + "]" : "full"));
        if (p.partial.length) td.append(el("div", {class: "sigma"}, "\u03A3"));
        tr.append(td); rank++;
      }
      tbl.append(tr);
    }
    grid.append(tbl); wrap.append(grid);
  }
  const axes = el("div", {class: "plabel"}, "rows: " + (inner === 2 ? mesh.names[nd - 2] : "-") + ", columns: " + mesh.names[nd - 1]);
  box.append(wrap, axes);
  return box;
}

// ---------- parallel program ----------
function parallelView(root, P) {
  root.append(el("div", {class: "summary"}, `mesh ${P.mesh.names.map((n, i) => n + "=" + P.mesh.shape[i]).join(",")}, strategy ${P.strategy}, ` +
    `${P.collectives.length} collectives, ${fmtBytes(P.comm_bytes)} sent per rank per step` + (P.note ? "; " + P.note : "")));
  const colls = el("div", {class: "colls"}), side = el("div", {class: "sides"});
  const left = el("div", {class: "side"}), right = el("div", {class: "side"});
  side.append(left, right); root.append(colls, side);
  if (P.compare) markCompare(P);
  const gv = new GraphView(left, P.global, P.mesh), lv = new GraphView(right, P.local, P.mesh);
  if (P.compare) linkCompare(root, P, gv, lv, side);
  const axes = [...new Set(P.collectives.map(c => c.axis))];
  const filt = el("select", {id: "axis-filter"});
  filt.append(el("option", {value: ""}, "every axis"));
  for (const a of axes) filt.append(el("option", {value: a}, a));
  const list = el("div", {class: "clist"}), why = el("div", {class: "why", id: "why"}, "click a collective for why it exists");
  colls.append(el("b", {}, "collectives "), filt, list, why);
  const fill = () => {
    list.textContent = "";
    P.collectives.forEach((c, i) => {
      if (filt.value && c.axis !== filt.value) return;
      const a = el("a", {href: "javascript:void 0", class: "coll", "data-i": i}, `${c.op} over ${c.axis} of %${c.value} (${fmtBytes(c.bytes)}, ${c.phase})`);
      a.addEventListener("click", () => showWhy(i)); list.append(a);
    });
  };
  const showWhy = i => {
    const c = P.collectives[i]; why.textContent = "";
    why.append(el("div", {class: "whyhead"}, `${c.op} over ${c.axis}: %${c.value} is placed ${c.have} where ${c.consumer} (operand ${c.operand}) needs ${c.want}`));
    const t = el("table", {class: "kv"});
    for (const k of Object.keys(c)) { const tr = el("tr"); tr.append(el("th", {}, k), el("td", {}, String(c[k]))); t.append(tr); }
    why.append(t);
    const have = parsePlacementText(c.have), want = parsePlacementText(c.want);
    const pair = el("div", {class: "pair"});
    const h = el("div"); h.append(el("div", {}, "producer's placement (have)"), drawPlacement(P.mesh, have));
    const w = el("div"); w.append(el("div", {}, "consumer's placement (want)"), drawPlacement(P.mesh, want));
    pair.append(h, w); why.append(pair);
    const hits = gv.find(String(c.value)); if (hits.length) gv.reveal(hits[0]);
    return c;
  };
  filt.addEventListener("change", fill); fill();
  return {gv, lv, showWhy, filt, fill, list, P};
}

// ---------- before / after ----------
function diffView(root, P) {
  const count = g => g.changed.reduce((a, b) => a + b, 0);
  root.append(el("div", {class: "summary", id: "diff-summary"}, `${P.before.n} nodes before, ${P.after.n} after; marked red: ` +
    `${count(P.before)} node(s) only before, ${count(P.after)} only after (compared by module and line, value names aside)`));
  const side = el("div", {class: "sides"}), left = el("div", {class: "side"}), right = el("div", {class: "side"});
  side.append(left, right); root.append(side);
  return {gv: new GraphView(left, P.before, null), after: new GraphView(right, P.after, null)};
}

// ---------- pipeline schedule ----------
const KCOL = {F: "#6b9bd1", B: "#7fbf7f", W: "#e0a050"};
function ganttView(root, S) {
  // each bar is stored as [kind, microbatch, chunk, start, end]
  const bars = S.bars.map(row => row.map(([k, mb, c, s, e]) => ({k, mb, c, s, e}))), nb = bars.reduce((a, r) => a + r.length, 0);
  const end = Math.max(1, bars.reduce((a, r) => r.reduce((x, b) => Math.max(x, b.e), a), 0));
  const U = Math.max(4, Math.min(40, (Math.max(600, window.innerWidth) - 120) / end));
  root.append(el("div", {class: "summary"}, `schedule ${S.name}: ${S.stages} stages, ${S.microbatches} microbatches` +
    (S.virtual > 1 ? `, ${S.virtual} chunks per rank` : "") + " (unit time: F 1, B 2, or B 1 and W 1 when split)"));
  const busy = bars.reduce((a, r) => r.reduce((x, b) => x + b.e - b.s, a), 0), bubble = 1 - busy / (end * bars.length);
  root.append(el("div", {class: "summary", id: "bubble"}, `predicted bubble ${(bubble * 100).toFixed(1)}%`));
  const M = S.measured, A = M && M.actions ? M.actions : null;
  // with measured actions, each rank's row has its measured actions under its predicted bars
  const pitch = A ? 58 : 34, py = p => 30 + p * pitch, nbRows = A ? Math.ceil(bars.length * pitch / 34) : bars.length;
  const nrow = nbRows + (M ? M.per_rank.length + 1 : 0);
  if (M) root.lastChild.textContent += `; measured ${(M.bubble * 100).toFixed(1)}% (time in recv, averaged over ` +
    `the ranks and ${M.steps > 1 ? M.steps - 1 : 1} step(s) after the first; the slowest rank's step ${(M.span * 1e3).toFixed(1)} ms ` +
    "drawn as long as the predicted schedule)";
  if (A) root.append(el("div", {class: "summary", id: "measured-actions"}, measuredCaption(A)));
  const W = 80 + end * U + 20, H = nrow * 34 + 30, label = b => b.k + b.mb + (S.virtual > 1 ? "." + b.c : "");
  const order = () => bars.map(row => row.map(b => b.k + b.mb));
  if (nb > 8000) {   // a big schedule: one canvas, not an element per bar
    const cv = el("canvas", {width: Math.min(W, 32000), height: H, id: "gantt", "data-bars": nb});
    const ctx = cv.getContext("2d"); ctx.font = "10px sans-serif";
    bars.forEach((row, p) => {
      ctx.fillStyle = "#222"; ctx.fillText("pp " + p, 4, py(p) + 16);
      for (const b of row) {
        ctx.fillStyle = KCOL[b.k] || "#aaa"; ctx.fillRect(80 + b.s * U, py(p), Math.max(1, (b.e - b.s) * U - 1), 26);
        if (U * (b.e - b.s) > 14) { ctx.fillStyle = "#000"; ctx.fillText(label(b), 80 + b.s * U + 2, py(p) + 17); }
      }
    });
    const paint = (x, y, w, h, c, t) => {
      ctx.fillStyle = c; if (w > 0) ctx.fillRect(x, y, w, h); else { ctx.fillStyle = "#222"; ctx.fillText(t, x, y + 16); } };
    if (M) measuredRows(M, nbRows, end, U, paint);
    if (A) measuredActions(A, py, end * U, (x, y, w, h, c, t) => paint(x, y, w, h, c, t), (x1, y1, x2, y2) => {
      ctx.strokeStyle = "#555"; ctx.beginPath(); ctx.moveTo(x1, y1); ctx.lineTo(x2, y2); ctx.stroke(); });
    root.append(cv);
    return {order, measured: M ? M.per_rank.length : 0};
  }
  const svg = sv("svg", {width: W, height: H, id: "gantt"});
  // sends and receives: a line from the bar that sends an activation (F) or a gradient (B)
  // to the bar on the next rank that receives it
  const at = new Map();
  bars.forEach((row, p) => row.forEach(b => at.set(b.k + b.c + "," + b.mb, [p, b])));
  const links = sv("g", {class: "links"});
  for (const [key, [p, b]] of at) {
    const src = b.k === "F" ? at.get("F" + (b.c - 1) + "," + b.mb) : b.k === "B" ? at.get("B" + (b.c + 1) + "," + b.mb) : null;
    if (!src || src[0] === p) continue;
    links.append(sv("line", {x1: 80 + src[1].e * U, y1: py(src[0]) + 13, x2: 80 + b.s * U, y2: py(p) + 13}));
  }
  bars.forEach((row, p) => {
    svg.append(sv("text", {x: 4, y: py(p) + 16, class: "rowlabel"}, "pp " + p));
    for (const b of row) {
      const g = sv("g", {class: "bar", "data-rank": p, "data-k": b.k, "data-mb": b.mb, "data-c": b.c});
      g.append(sv("rect", {x: 80 + b.s * U, y: py(p), width: Math.max(1, (b.e - b.s) * U - 1), height: 26, fill: KCOL[b.k] || "#aaa"}));
      if (U * (b.e - b.s) > 14) g.append(sv("text", {x: 80 + b.s * U + 2, y: py(p) + 17}, label(b)));
      g.append(sv("title", {}, `${b.k} microbatch ${b.mb} chunk ${b.c}: ${b.s}-${b.e}`));
      svg.append(g);
    }
  });
  for (let t = 0; t <= end; t += Math.max(1, Math.round(end / 20))) svg.append(sv("text", {x: 80 + t * U, y: 14, class: "tick"}, t));
  svg.append(links);
  let measured = 0, actions = 0;
  const mlinks = sv("g", {class: "mlinks"});
  if (M) measuredRows(M, nbRows, end, U, (x, y, w, h, c, t) => {
    if (w > 0) { const r = sv("rect", {x, y, width: w, height: h, fill: c, class: "mbar"}); r.append(sv("title", {}, t)); svg.append(r); measured++; }
    else svg.append(sv("text", {x, y: y + 16, class: "rowlabel"}, t)); });
  if (A) measuredActions(A, py, end * U, (x, y, w, h, c, t, a) => {
    if (!a) { svg.append(sv("text", {x, y: y + 13, class: "rowlabel"}, t)); return; }
    const g = sv("g", {class: "mact" + (a.k.startsWith("recv") ? " mwait" : ""), "data-rank": a.p, "data-k": a.k, "data-mb": a.mb,
      "data-c": a.c, "data-x": x});
    g.append(sv("rect", {x, y, width: w, height: h, fill: c}));
    if (w > 16 && "FBW".includes(a.k)) g.append(sv("text", {x: x + 2, y: y + 13, "font-size": 9, "font-family": "sans-serif"}, a.k + a.mb));
    g.append(sv("title", {}, t)); svg.append(g); actions++; }, (x1, y1, x2, y2, t) => {
    const l = sv("line", {x1, y1, x2, y2, class: "mlink", stroke: "#333", "stroke-width": 1}); l.append(sv("title", {}, t)); mlinks.append(l); });
  svg.append(mlinks);
  root.append(svg);
  return {order, links: links.children.length, measured, actions, mlinks: mlinks.children.length};
}

function measuredCaption(A) {
  const C = A.clock, us = t => (t * 1e6).toFixed(1) + " us";
  return `under each rank: its actions as run in step ${A.step} (the median step after the first; ` + (C ?
    `all ranks on one clock: each rank's step start on the wall clock, then a rank moved later where a recv would ` +
    `end before its send started; send-after-recv violation ${us(C.before)} with the wall clock alone, ` +
    `${us(C.after)} after` + (C.moved.length ? ` (moved: r${C.moved.join(", r")})` : "") + `; ${(C.common_span * 1e3).toFixed(1)} ms ` +
    "from the first start to the last end drawn as long as the predicted schedule); lines join each send to its recv; "
    : `${(A.span * 1e3).toFixed(1)} ms, the slowest rank's, drawn as long as the predicted schedule), from each rank's own ` +
    "step start; ") + "red: waiting in a recv, grey ticks: sends";
}

// each pp rank's schedule actions as run, under its predicted bars: one rank of the stage in
// one step, on the ranks' common clock where the run recorded one (else from each rank's own
// step start, the slowest rank's step drawn ``width`` long); ``link`` joins a send to its recv
function measuredActions(A, py, width, draw, link) {
  const C = A.clock, s = width / Math.max(C ? C.common_span : A.span, 1e-12), ms = t => (t * 1e3).toFixed(2);
  const at = (p, i) => { const R = A.rows[p], b = R.bars[i]; return [80 + ((R.offset || 0) + b[3]) * s, 80 + ((R.offset || 0) + b[4]) * s]; };
  for (const [p, i, q, j] of A.links || []) {
    const [x1] = at(p, i), [, x2] = at(q, j), b = A.rows[q].bars[j];
    link(x1, py(p) + 39, x2, py(q) + 39, `${A.rows[p].bars[i][0]} r${A.rows[p].rank} -> ${b[0]} microbatch ${b[1]} chunk ${b[2]} r${A.rows[q].rank}`);
  }
  A.rows.forEach((R, p) => {
    const y = py(p) + 30, o = R.offset || 0;
    if (R.rank === null) return;
    draw(4, y, 0, 0, "", "run r" + R.rank, null);
    for (let [k, mb, c, a, b] of R.bars) {
      a += o; b += o;
      const recv = k.startsWith("recv"), send = k.startsWith("send"), once = mb < 0;
      const col = recv ? "#e05050" : send ? "#555" : once ? "#bbb" : (KCOL[k] || "#aaa");
      const x = 80 + a * s, w = send ? 2 : Math.max(1, (b - a) * s - (recv ? 0 : 1));
      const what = once ? k + " (once per step)" : `${k} microbatch ${mb} chunk ${c}`;
      draw(x, recv ? y + 4 : send ? y - 2 : y, w, recv ? 10 : send ? 22 : 18, col,
           `${what}: ${ms(a)}-${ms(b)} ms ` + (C ? `on the common clock (rank ${R.rank}'s step from ${ms(o)} ms, ` :
             `of rank ${R.rank}'s step ${A.step} (`) + `${ms(R.step_s)} ms long)` + (recv ? ", waiting" : ""),
           {p, k, mb, c});
    }
  });
}

// ---------- simulated timeline ----------
function timelineView(root, T) {
  root.append(el("div", {class: "summary"}, `simulated step ${(T.step * 1e3).toFixed(3)} ms on ${T.cluster}, ${String(T.mesh).replace(/^mesh\(([^)]*)\)$/, "mesh $1")}; ` +
    "alike ranks shown once with their count; red: the compute stream waiting" + (T.truncated ? " (neighbouring spans merged to keep the page small)" : "")));
  const W = 1100, LX = 150, RH = 18, scale = (W - LX) / Math.max(T.step, 1e-12);
  const rows = [];
  for (const r of T.ranks) {
    const names = Object.keys(T.streams).filter(k => +k.split("|")[0] === r.rank).map(k => k.split("|")[1]).sort();
    for (const s of names) rows.push([r, s]);
    if (!names.length) rows.push([r, "compute"]);
  }
  const cv = el("canvas", {width: W, height: rows.length * (RH + 4) + 20, id: "timeline"});
  const ctx = cv.getContext("2d"); ctx.font = "11px sans-serif";
  const spans = [], waits = [];
  rows.forEach(([r, s], i) => {
    const y = 10 + i * (RH + 4), ev = T.streams[r.rank + "|" + s] || [];
    ctx.fillStyle = "#222"; ctx.fillText(`rank ${r.rank}${r.count > 1 ? " \u00D7" + r.count : ""} ${s}`, 2, y + 13);
    ctx.fillStyle = "#f4f4f4"; ctx.fillRect(LX, y, W - LX, RH);
    let prev = 0;
    for (const e of ev) {
      if (s === "compute" && e[0] - prev > T.step * 1e-3) {
        ctx.fillStyle = "#e05050"; ctx.fillRect(LX + prev * scale, y, Math.max(1, (e[0] - prev) * scale), RH); waits.push([r.rank, prev, e[0]]);
      }
      ctx.fillStyle = s === "compute" ? "#6b9bd1" : "#e0a050";
      ctx.fillRect(LX + e[0] * scale, y + 2, Math.max(0.5, (e[1] - e[0]) * scale), RH - 4);
      spans.push([LX + e[0] * scale, y, Math.max(2, (e[1] - e[0]) * scale), e, r.rank, s]);
      prev = Math.max(prev, e[1]);
    }
  });
  const tip = el("div", {class: "why", id: "span-info"}, "click a span");
  cv.addEventListener("click", ev => {
    const b = cv.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
    const s = spans.find(q => x >= q[0] && x <= q[0] + q[2] && y >= q[1] && y <= q[1] + RH);
    if (s) tip.textContent = `rank ${s[4]} ${s[5]}: ${s[3][2]} ${s[3][3] || ""} ${(s[3][0] * 1e3).toFixed(3)}-${(s[3][1] * 1e3).toFixed(3)} ms`;
  });
  root.append(cv, tip);
  root.append(memoryView(T));
  root.append(el("pre", {class: "simtext"}, T.text));
  return {rows: rows.length, spans: spans.length, waits: waits.length};
}
function memoryView(T) {
  const box = el("div", {class: "memory", id: "memory"});
  const ranks = T.ranks.filter(r => r.memory);
  if (!ranks.length) { box.append(el("div", {}, "memory per rank: not computed (a pipeline: simulate with --check-memory or --unroll)")); return box; }
  box.append(el("b", {}, "memory at the peak per rank (% of the device's memory)"));
  const cats = [...new Set(ranks.flatMap(r => Object.keys(r.memory.at_peak)))];
  const cols = ["#6b9bd1", "#7fbf7f", "#e0a050", "#b58fd0", "#d07f7f", "#8fd0c8", "#c8c870", "#999"];
  // the memory tab's colours for the same kinds ("activations and temporaries": activations)
  const color = (c, k) => MCOL[c] || MCOL[c.split(" ")[0]] || cols[k % cols.length];
  const max = Math.max(...ranks.map(r => r.memory.peak)) || 1, W = 700;
  const svg = sv("svg", {width: 150 + W + 10, height: ranks.length * 24 + 30});
  ranks.forEach((r, i) => {
    let x = 150; const y = 4 + i * 24;
    const pct = T.capacity ? ` (${(100 * r.memory.peak / T.capacity).toFixed(1)}%)` : "";
    svg.append(sv("text", {x: 2, y: y + 14}, `rank ${r.rank}${r.count > 1 ? " \u00D7" + r.count : ""} ${fmtBytes(r.memory.peak)}${pct}`));
    cats.forEach((c, k) => {
      const w = (r.memory.at_peak[c] || 0) / max * W; if (w <= 0) return;
      const rc = sv("rect", {x, y, width: w, height: 18, fill: color(c, k)}); rc.append(sv("title", {}, c + " " + fmtBytes(r.memory.at_peak[c])));
      svg.append(rc); x += w;
    });
  });
  const ly = ranks.length * 24 + 20; let lx = 150;
  cats.forEach((c, k) => {
    svg.append(sv("rect", {x: lx, y: ly - 9, width: 10, height: 10, fill: color(c, k)}));
    svg.append(sv("text", {x: lx + 13, y: ly}, c)); lx += 26 + c.length * 6.2;
  });
  svg.setAttribute("width", Math.max(150 + W + 10, lx));
  box.append(svg);
  return box;
}

// ---------- page ----------
function main() {
  const D = JSON.parse(document.getElementById("pdata").textContent);
  const tabs = document.getElementById("tabs"), body = document.getElementById("views"), views = {};
  const add = (name, fill) => {
    const v = el("section", {class: "view", id: "view-" + name});
    const b = el("button", {"data-view": name}, name);
    b.addEventListener("click", () => show(name)); tabs.append(b); body.append(v);
    views[name] = {v, b, fill, done: null};
  };
  const show = name => {
    for (const k in views) { views[k].v.style.display = k === name ? "" : "none"; views[k].b.classList.toggle("on", k === name); }
    const V = views[name]; if (V.done === null) V.done = V.fill(V.v) || {};
    return V.done;
  };
  if (D.kind === "graph") add("graph", v => ({gv: new GraphView(v, D.graph, null)}));
  if (D.kind === "parallel") add("parallel", v => parallelView(v, D.plan));
  if (D.kind === "diff") add("before / after", v => diffView(v, D.diff));
  if (D.kind === "pipeline") {
    add("schedule", v => ganttView(v, D.pipeline.schedule));
    if (D.pipeline.stage0) add("stage 0", v => parallelView(v, D.pipeline.stage0));
  }
  if (D.memory) add("memory", v => memoryCurveView(v, D.memory));
  if (D.sim) add("timeline", v => timelineView(v, D.sim));
  const first = Object.keys(views)[0];
  show(first);
  window.PARTITA = {D, views, show};
  runTest(D, views, show);
}

function runTest(D, views, show) {
  const m = /#test=([a-z]+)(?::(.*))?/.exec(location.hash);
  if (!m) return;
  const t0 = performance.now(), out = {test: m[1], readyMs: t0};
  try {
    if (m[1] === "search") {
      const gv = (show("graph").gv || show("parallel").gv);
      gv.search.value = decodeURIComponent(m[2] || "");
      const hits = gv.runSearch(gv.search.value);
      out.hits = hits.length;
      if (hits.length) { gv.reveal(hits[0]); out.line = gv.detail.querySelector(".pirline").textContent; out.boxes = gv.items.length; }
      out.detailText = gv.detail.textContent;
    } else if (m[1] === "expand") {
      const gv = show(Object.keys(views)[0]).gv;
      out.before = gv.items.length; let n = 0;
      for (let i = 1; i < gv.groups.length; i++) { gv.expanded[i] = 1; n++; }
      gv.relayout(); out.after = gv.items.length; out.drawn = gv.svg.querySelectorAll("g.node,g.group").length;
    } else if (m[1] === "collective") {
      const P = show(views["parallel"] ? "parallel" : "stage 0");
      const i = +(m[2] || 0);
      if (P.filt.options.length > 1) { P.filt.value = P.filt.options[1].value; P.fill(); out.filtered = P.list.children.length; out.axis = P.filt.value; P.filt.value = ""; P.fill(); }
      P.list.children[i].click();
      out.why = document.getElementById("why").textContent; out.ranks = document.querySelectorAll("#why td.rank").length;
      out.grids = document.querySelectorAll("#why .pgrid").length; out.partial = document.querySelectorAll("#why td.partial").length;
    } else if (m[1] === "gantt") {
      const G = show("schedule");
      const svgBars = document.querySelectorAll("#gantt g.bar");
      // the drawn bars' order, read from the SVG; a big schedule's canvas: from its data
      out.rows = svgBars.length ? [...new Set([...svgBars].map(b => b.dataset.rank))].map(r =>
        [...document.querySelectorAll(`#gantt g.bar[data-rank="${r}"]`)].map(b => b.dataset.k + b.dataset.mb)) : G.order();
      out.canvas = !svgBars.length; out.links = G.links; out.measured = G.measured;
      // the measured actions (F, B, W) per rank, ordered by where they are drawn; recv waits counted
      const acts = [...document.querySelectorAll("#gantt g.mact")];
      out.mlinks = G.mlinks || 0;   // sends joined to their recvs; any drawn ending left of its start
      out.mlinksBack = [...document.querySelectorAll("#gantt line.mlink")].filter(l => +l.getAttribute("x2") < +l.getAttribute("x1") - 0.01).length;
      out.actions = G.actions || 0; out.waits = acts.filter(a => a.classList.contains("mwait")).length;
      out.measuredRows = [...new Set(acts.map(a => a.dataset.rank))].map(r => acts.filter(a => a.dataset.rank === r &&
        "FBW".includes(a.dataset.k)).sort((a, b) => +a.dataset.x - +b.dataset.x).map(a => a.dataset.k + a.dataset.mb));
      out.bubble = document.getElementById("bubble").textContent;
    } else if (m[1] === "timeline") {
      Object.assign(out, show("timeline"));
      out.memory = document.querySelectorAll("#memory rect").length;
    } else if (m[1] === "diff") {
      const V = show("before / after");
      out.summary = document.getElementById("diff-summary").textContent;
      out.markedBoxes = document.querySelectorAll("#views g.changed").length;
    } else if (m[1] === "compare") {
      compareTest(show(views["parallel"] ? "parallel" : "stage 0"), out);
    } else if (m[1] === "memory") {
      Object.assign(out, show("memory"));
      out.areas = document.querySelectorAll("#view-memory polygon.marea").length;
      out.peakLines = document.querySelectorAll("#view-memory line.mpeak").length;
    } else if (m[1] === "load") {
      out.views = Object.keys(views);
      const w = document.getElementById("too-large"); out.tooLarge = w ? w.textContent : "";
    }
  } catch (e) { ERRORS.push("test: " + e + " " + (e.stack || "")); }
  out.ms = performance.now() - t0;
  out.errors = ERRORS.slice();
  document.getElementById("test-result").textContent = JSON.stringify(out);
}
window.addEventListener("DOMContentLoaded", () => {
  try { main(); } catch (e) { ERRORS.push("main: " + e + " " + (e.stack || "")); showErrors(); }
  const r = document.getElementById("test-result");
  if (/#test=/.test(location.hash) && !r.textContent) r.textContent = JSON.stringify({errors: ERRORS});
});
"""
