"""The view page: one HTML file with its style, script and data inline (no network request)."""

from __future__ import annotations

import html
import json

from .script import SCRIPT
from .script_more import SCRIPT_MORE

STYLE = """
body { font: 13px/1.35 system-ui, sans-serif; margin: 0; color: #222; }
header { background: #2d3a4a; color: #fff; padding: 6px 10px; }
header b { margin-right: 16px; }
#tabs button { margin-right: 4px; border: 0; padding: 4px 10px; border-radius: 3px; cursor: pointer; }
#tabs button.on { background: #ffd76a; }
section.view { padding: 8px; }
.summary { margin: 4px 0; color: #333; }
.warn { background: #fff3c4; border: 1px solid #e0c050; padding: 6px; margin: 4px 0; }
#errors:not(:empty) { background: #fdd; color: #900; padding: 6px; white-space: pre-wrap; }
.gview { display: grid; grid-template-columns: minmax(300px, 1fr) 340px; grid-template-rows: auto auto 1fr;
         gap: 4px; height: calc(100vh - 90px); min-height: 420px; }
.gview > .warn, .gview > .gbar { grid-column: 1 / 3; }
.gresults { grid-column: 1 / 3; max-height: 120px; overflow: auto; }
.gresults a.hit { display: block; color: #1a4f8a; text-decoration: none; font-family: monospace; font-size: 12px; }
.gscroll { overflow: auto; border: 1px solid #ccc; background: #fbfbfb; }
.gdetail { overflow: auto; border: 1px solid #ccc; padding: 6px; background: #fff; }
.gsearch { width: 260px; margin: 0 8px; }
.gsvg .edges path { fill: none; stroke: #9aa; stroke-width: 1; }
.gsvg g { cursor: pointer; }
.gsvg g.node rect { fill: #e8f0fa; stroke: #6b8fbf; }
.gsvg g.node.rc rect { fill: #f3e8fa; }
.gsvg g.node.sel rect { fill: #ffd76a; stroke: #b08000; stroke-width: 2; }
.gsvg g.group rect { fill: #e9f5e4; stroke: #5f9f50; }
.gsvg g.changed rect { stroke: #d03030; stroke-width: 2.5; }
.gsvg text { font: 11px monospace; pointer-events: none; }
pre.pirline { white-space: pre-wrap; word-break: break-all; background: #f4f4f4; padding: 4px; font-size: 11px; }
table.kv th { text-align: left; vertical-align: top; padding-right: 8px; color: #555; font-weight: normal; }
table.kv td { font-family: monospace; font-size: 12px; word-break: break-all; }
.placement { margin-top: 6px; }
.pgrids { display: flex; flex-wrap: wrap; gap: 8px; }
.pgrid table { border-collapse: collapse; }
.pgrid td.rank { border: 1px solid #888; width: 44px; height: 34px; text-align: center; font: 10px monospace;
                 position: relative; }
.pgrid td.partial { outline: 2px dashed #c03030; outline-offset: -3px; }
.pgrid .rk { color: #666; }
.pgrid .sigma { position: absolute; top: 0; right: 2px; color: #c03030; font-weight: bold; }
.plabel { font-size: 11px; color: #555; }
.colls { border: 1px solid #ccc; padding: 6px; margin-bottom: 6px; display: grid;
         grid-template-columns: 1fr 1fr; gap: 6px; }
.colls > b, .colls > select { grid-column: 1 / 3; justify-self: start; }
.clist { max-height: 260px; overflow: auto; }
.clist a.coll { display: block; color: #1a4f8a; text-decoration: none; font-family: monospace; font-size: 12px; }
.why { border-left: 3px solid #ffd76a; padding-left: 8px; max-height: 420px; overflow: auto; }
.whyhead { font-weight: bold; margin-bottom: 4px; }
.pair { display: flex; gap: 16px; flex-wrap: wrap; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 8px; }
.sides .gview { grid-template-columns: minmax(200px, 1fr) 260px; height: 70vh; }
#gantt .links line { stroke: #444; stroke-width: 1; stroke-dasharray: 2 2; pointer-events: none; }
#gantt .bar text, .tick, .rowlabel { font: 10px sans-serif; }
#test-result { display: none; }
.memory svg { display: block; margin-top: 4px; }
.memory svg text { font: 11px sans-serif; }
.gsvg g.node.resized rect { stroke: #e08a00; stroke-width: 2; }
.gsvg g.node.changed.resized rect { stroke: #d03030; }
#gantt rect.mbar { stroke: none; }
.mcurve { margin: 6px 0; }
.mcurve svg line.mpeak { stroke: #c00; stroke-width: 1.5; stroke-dasharray: 4 2; }
.mcurve svg text { font: 11px sans-serif; }
.mlegend span { margin-right: 14px; font-size: 12px; }
.mlegend i { display: inline-block; width: 10px; height: 10px; }
pre.simtext { font-size: 11px; background: #f4f4f4; padding: 6px; overflow: auto; }
"""


def render_page(data: dict, title: str) -> str:
    """The page's HTML: ``data`` as one JSON blob, the style and the script inline."""
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    t = html.escape(title)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">"
            f"<title>{t}</title><style>{STYLE}</style></head><body>"
            f"<header><b>partita view: {t}</b><span id=\"tabs\"></span></header>"
            "<div id=\"errors\"></div><main id=\"views\"></main><pre id=\"test-result\"></pre>"
            f"<script type=\"application/json\" id=\"pdata\">{blob}</script>"
            f"<script>{SCRIPT}{SCRIPT_MORE}</script></body></html>\n")
