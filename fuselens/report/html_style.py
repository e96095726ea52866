"""The stylesheet inlined into every HTML report (system fonts only, so the
page needs nothing from the network)."""

CSS = """
:root { --fg:#1f2328; --muted:#656d76; --line:#d0d7de; --bg:#ffffff; --panel:#f6f8fa;
  --warn:#9a6700; --warn-bg:#fff8c5; --err:#cf222e; --err-bg:#ffebe9; --ok:#1a7f37; --ok-bg:#dafbe1;
  --accent:#0969da; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font: 14px/1.5 -apple-system, "Segoe UI", "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
code, pre, .loc { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; }
code { background: var(--panel); padding: 1px 4px; border-radius: 4px; overflow-wrap: anywhere; }
pre { background: var(--panel); padding: 10px 12px; border-radius: 6px; overflow-x: auto; margin: 6px 0; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; border-bottom: 1px solid var(--line); padding-bottom: 6px; margin-top: 32px; }
h3 { font-size: 14.5px; margin: 0 0 6px; font-weight: 600; }
a { color: var(--accent); }
.muted { color: var(--muted); font-weight: normal; font-size: 13px; }
header .target { margin: 0 0 8px; font-size: 15px; }
.chips { margin: 0; }
.chip { display:inline-block; background: var(--panel); border:1px solid var(--line); border-radius: 12px;
  padding: 1px 10px; margin: 0 6px 6px 0; font-size: 12.5px; color: var(--muted); }
.verdict { font-size: 16px; font-weight: 600; padding: 10px 14px; border-radius: 6px; margin: 16px 0 12px; }
.verdict.bad { background: var(--warn-bg); color: #6b4a00; }
.verdict.ok { background: var(--ok-bg); color: var(--ok); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr)); gap: 10px; }
.card { display:block; border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px;
  text-decoration: none; color: inherit; background: var(--bg); }
.card:hover { border-color: var(--accent); }
.card .num { font-size: 22px; font-weight: 650; }
.card .label { color: var(--muted); font-size: 12.5px; }
.card .sub { color: var(--muted); font-size: 11.5px; }
.card.bad { border-color: #e5b3b3; background: #fff5f4; }
.card.bad .num { color: var(--err); }
.finding { border: 1px solid var(--line); border-left: 4px solid var(--line); border-radius: 6px;
  padding: 10px 14px; margin: 10px 0; }
.finding.warn { border-left-color: #d4a72c; }
.finding.error { border-left-color: var(--err); }
.loc { font-weight: 600; }
.tag { display:inline-block; font-size: 11.5px; font-weight: 600; padding: 0 7px; border-radius: 10px;
  background: var(--panel); border: 1px solid var(--line); color: var(--muted); text-decoration: none;
  vertical-align: 1px; }
.tag.warn { background: var(--warn-bg); color: var(--warn); border-color: #eed888; }
.tag.error { background: var(--err-bg); color: var(--err); border-color: #f5c2c0; }
.tag.ok { background: var(--ok-bg); color: var(--ok); border-color: #aceebb; }
.count { font-weight: 700; color: var(--warn); }
pre.src { background: #f6f8fa; border-left: 3px solid var(--line); padding: 4px 10px; }
.gutter { color: var(--muted); display: inline-block; min-width: 3ch; margin-right: 12px; text-align: right;
  user-select: none; }
dl.notes { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0 0; }
dl.notes dt { color: var(--muted); font-weight: 600; }
dl.notes dd { margin: 0; }
.fix { color: var(--ok); }
.fix.verified { font-weight: 600; }
.charts { display: grid; grid-template-columns: 1fr; gap: 12px; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; overflow-x: auto; }
figcaption { font-weight: 600; margin-bottom: 6px; }
svg.chart { max-width: 100%; height: auto; }
.chart-label { font: 12px ui-monospace, Menlo, Consolas, "DejaVu Sans Mono", monospace; fill: var(--fg); }
.chart-value { font: 12px -apple-system, "Segoe UI", Arial, sans-serif; fill: var(--muted); }
.graph { border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; margin: 12px 0; }
.graph-svg { overflow: auto; max-height: 1100px; border-top: 1px solid var(--line); padding-top: 8px; }
/* natural size (readable labels); big graphs scroll inside their box */
.graph-svg svg { max-width: none; height: auto; }
.legend { list-style: none; padding: 0; margin: 8px 0; display: flex; flex-wrap: wrap; gap: 4px 16px;
  font-size: 12.5px; }
.swatch { display:inline-block; width: 12px; height: 12px; border: 1px solid #888; border-radius: 3px;
  margin-right: 6px; vertical-align: -1px; }
.notice { background: var(--warn-bg); border: 1px solid #eed888; border-radius: 6px; padding: 8px 12px; }
.ops { line-height: 1.9; }
/* Tables stay inside the page: long names, paths and reasons wrap anywhere
(so a cell's narrowest width is small), and what still cannot fit scrolls
inside its own box instead of widening the page. */
.table-wrap { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 6px 8px; text-align: left; vertical-align: top;
  overflow-wrap: anywhere; }
td .loc, td code { overflow-wrap: anywhere; }
th { background: var(--panel); font-weight: 600; }
td.n { text-align: right; white-space: nowrap; }
td details summary { font-size: 12px; color: var(--accent); cursor: pointer; }
.kernels td:first-child { min-width: 16em; }
.kname { display: flex; align-items: baseline; }
.fusion td:nth-child(2) { min-width: 9em; }
pre.kernel-src { max-height: 480px; font-size: 12px; }
details > summary { cursor: pointer; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; border-top: 1px solid var(--line);
  padding-top: 8px; }
"""
