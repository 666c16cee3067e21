"""The report page: one self-contained HTML file (styles, script and figures inline, the
figures as ``data:image/png;base64`` URIs), nothing fetched from anywhere.

A small inline script marks ``<body data-figures-loaded="N">`` on the window's load event,
``N`` being how many figures decoded (``naturalWidth > 0``), so a headless browser can check
the page; clicking a wide figure switches it between its natural size and the page's width.

Example:
    >>> page = render_page("mlp", [("model", "mlp")], [Section("s", "A section", "<p>text</p>")])
    >>> page.startswith("<!DOCTYPE html>"), "data-figures-loaded" in page, "A section" in page
    (True, True, True)
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass

CSS_DPI = 96
"""CSS pixels per inch: a figure is shown at its size in inches times this."""

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0;
       color: #1d1d1f; background: #fafafa; }
main { max-width: 1440px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 19px; margin: 36px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.sub { color: #555; margin: 0 0 14px; }
table { border-collapse: collapse; font-size: 13px; margin: 10px 0; background: white; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.header th { width: 170px; }
.figure-box { background: white; border: 1px solid #ddd; padding: 6px; overflow: auto; max-height: 88vh; }
.figure-box img { display: block; }
.figure-box img.fit { max-width: 100%; height: auto; }
.figure-box img.zoomable { cursor: zoom-in; }
.figure-box img.zoomable.natural { cursor: zoom-out; }
p.caption { color: #444; font-size: 13px; margin: 6px 0; }
p.note { background: #fff8e1; border: 1px solid #f0d890; padding: 8px 12px; font-size: 14px; }
details { margin: 8px 0; font-size: 13px; }
summary { cursor: pointer; color: #2a5ea8; }
code { font-size: 12px; }
"""

_SCRIPT = """
window.addEventListener("load", function () {
  var loaded = 0;
  document.querySelectorAll("img.figure").forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { loaded += 1; }
  });
  document.body.setAttribute("data-figures-loaded", String(loaded));
});
document.addEventListener("click", function (event) {
  var img = event.target;
  if (img.classList && img.classList.contains("zoomable")) {
    img.classList.toggle("natural");
    img.classList.toggle("fit");
  }
});
"""


@dataclass(frozen=True)
class FigureImage:
    """One figure for the page: its PNG, its size in inches (shown at :data:`CSS_DPI`), its
    alt text; ``natural``: shown at full size in a scrolling box (a large graph), else fitted
    to the page's width (a click switches either way).

    Example:
        >>> FigureImage(b"png", 2.0, "a figure").html()[:60]
        '<div class="figure-box"><img class="figure zoomable fit" wid'
    """

    png: bytes
    width_in: float
    alt: str
    natural: bool = False

    def html(self) -> str:
        data = base64.b64encode(self.png).decode("ascii")
        width = round(self.width_in * CSS_DPI)
        cls = "figure zoomable " + ("natural" if self.natural else "fit")
        return (f'<div class="figure-box"><img class="{cls}" width="{width}" alt="{html.escape(self.alt)}" '
                f'src="data:image/png;base64,{data}"></div>')


@dataclass(frozen=True)
class Section:
    """A titled part of the page; ``body`` is HTML, built with :func:`table`, :func:`paragraph`...

    Example:
        >>> Section("memory", "2. Memory", paragraph("text")).key
        'memory'
    """

    key: str
    title: str
    body: str


def paragraph(text: str, cls: str = "caption") -> str:
    """``text`` (plain, escaped) as a paragraph of class ``cls`` (``caption`` or ``note``).

    Example:
        >>> paragraph("a < b", "note")
        '<p class="note">a &lt; b</p>'
    """
    return f'<p class="{cls}">{html.escape(text)}</p>'


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    """An HTML table; numbers are right-aligned, everything is escaped.

    Example:
        >>> table(["op", "count"], [["Conv", 3]])
        '<table><tr><th>op</th><th>count</th></tr><tr><td>Conv</td><td class="num">3</td></tr></table>'
    """
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    attrs = f' class="{cls}"' if cls else ""
    return f"<table{attrs}><tr>{head}</tr>{body}</table>"


def _cell(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"<td>{html.escape(str(value))}</td>"
    return f'<td class="num">{html.escape(str(value))}</td>'


def details(summary: str, body: str) -> str:
    """``body`` (HTML) folded under a clickable ``summary`` (plain text).

    Example:
        >>> details("more", "<p>x</p>")
        '<details><summary>more</summary><p>x</p></details>'
    """
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


def render_page(title: str, header: Sequence[tuple[str, str]], sections: Sequence[Section],
                subtitle: str = "") -> str:
    """The whole page: a title, the header table (name, value), then each section (see the
    module example)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head><body>",
        "<main>",
        f"<h1>{html.escape(title)}</h1>",
        paragraph(subtitle, "sub") if subtitle else "",
        '<table class="header">' + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                          for k, v in header) + "</table>",
    ]
    for s in sections:
        parts.append(f'<section id="{html.escape(s.key)}"><h2>{html.escape(s.title)}</h2>{s.body}</section>')
    parts += ["</main>", f"<script>{_SCRIPT}</script>", "</body></html>", ""]
    return "\n".join(p for p in parts if p)


__all__ = ["CSS_DPI", "FigureImage", "Section", "details", "paragraph", "render_page", "table"]
