"""The head of the HTML pages prodip ships, written once: the export's browser page
(``export/web/index.html``, written into every export as ``index.html``) and ``prodip serve``'s
playground (``serve/playground.html``, ``GET /playground``).

Each page file holds its title in a first-line comment, ``<!-- title: ... -->``, then its
``<body>`` ... ``</html>``; :func:`render_page` puts the shared head (charset, viewport, styles)
above it. The pages load nothing from another site, so the styles are inline.

    python -c "from prodip.base.page import render_page; print(render_page('<!-- title: t -->\\n<body></body>'))"
"""

from __future__ import annotations

import html
import re

_HEAD = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body {{ font: 15px/1.45 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }}
  textarea {{ width: 100%; min-height: 5rem; font: inherit; }}
  #out {{ white-space: pre-wrap; border: 1px solid #ccc; padding: .6rem; min-height: 4rem; }}
  #stats, #status {{ color: #555; font-size: 13px; }}
</style>
</head>
"""
_TITLE = re.compile(r"<!-- title: (.+?) -->\n")


def render_page(page: str) -> str:
    """The whole HTML document of a page file's text: the shared head, then the page's body.

    Args:
        page: a page file's text: ``<!-- title: TITLE -->`` on the first line, then ``<body>`` ... ``</html>``.
    Returns:
        The document, starting with ``<!doctype html>``; TITLE is HTML-escaped into ``<title>``.
    Raises:
        ValueError: the text does not start with the title comment.
    """
    m = _TITLE.match(page)
    if m is None:
        raise ValueError("a page file must start with `<!-- title: ... -->` on its own line (prodip.base.page)")
    return _HEAD.format(title=html.escape(m.group(1))) + page[m.end() :]
