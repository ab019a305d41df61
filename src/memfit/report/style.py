"""The look the HTML pages share (the run report, the estimate and plan pages, the notebook
views): the components' colours and the page style. Plain data, no imports: the notebook views
that use it sit below the results they render (tests/test_layering.py)."""

#: One colour per memory component, in the order of :data:`memfit.estimate.result.COMPONENTS`
#: (the pages draw and list the components in this order; a test holds the two equal).
COMPONENT_COLORS = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_states": "#e15759",
    "activations": "#76b7b2",
    "kv_cache": "#59a14f",
    "temporary": "#edc948",
}

#: The page style.
PAGE_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
background:#f6f7f9;color:#1d2330}
main{max-width:960px;margin:0 auto;padding:20px}
h1{font-size:22px;margin:4px 0 2px}
h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d8dbe0;padding-bottom:4px}
.meta{color:#5b6270;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{background:#fff;border:1px solid #d8dbe0;border-radius:6px;padding:8px 12px;min-width:130px}
.card b{display:block;font-size:18px}
.card span{color:#5b6270;font-size:12px}
.chart{background:#fff;border:1px solid #d8dbe0;border-radius:6px;margin:6px 0;width:100%;
height:auto}
.chart .title{font-weight:600;font-size:14px;fill:#1d2330}
.chart .plot{fill:#fff;stroke:#c4c8cf}
.chart .grid{stroke:#eceef1}
.chart .axis{stroke:#8a909b}
.chart text{font-size:11px;fill:#4a505c}
.chart .ytick{text-anchor:end}
.chart .xtick,.chart .xlabel{text-anchor:middle}
.chart .hlabel{text-anchor:end;font-weight:600}
.chart .vlabel{font-weight:600;text-anchor:end}
.chart .inbar{fill:#fff;font-weight:600}
.chart .empty{fill:#8a909b}
table{border-collapse:collapse;background:#fff;margin:6px 0;width:100%}
th,td{border:1px solid #d8dbe0;padding:4px 8px;text-align:left;font-size:13px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b3261e;font-weight:600}
.good{color:#1e7d32;font-weight:600}
.box{background:#fff;border:1px solid #d8dbe0;border-left:4px solid #8a909b;border-radius:4px;
padding:8px 12px;margin:8px 0}
.box.warn{border-left-color:#d62728}
.box.ok{border-left-color:#2ca02c}
code{font-size:12px;background:#eef0f3;padding:1px 4px;border-radius:3px}
footer{color:#8a909b;font-size:12px;margin:30px 0 10px}
"""
