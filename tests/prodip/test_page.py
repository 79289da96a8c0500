"""The HTML pages prodip ships share one head (prodip.base.page): the export's browser page and serve's playground.

python -m pytest tests/prodip/test_page.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prodip.base.page import render_page

REPO = Path(__file__).resolve().parents[2]


def test_render_page_puts_the_shared_head_above_the_body():
    doc = render_page("<!-- title: a <b> & c -->\n<body><p>x</p></body>\n</html>\n")
    assert doc.startswith('<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n')
    assert "<title>a &lt;b&gt; &amp; c</title>" in doc  # the title is escaped
    assert doc.endswith("</head>\n<body><p>x</p></body>\n</html>\n")
    assert doc.count("<head>") == 1 and "<!-- title" not in doc


def test_a_page_without_its_title_line_is_refused():
    with pytest.raises(ValueError, match="title"):
        render_page("<!doctype html>\n<html><head></head><body></body></html>")


def test_the_export_page_is_written_with_the_shared_head(tmp_path):
    from prodip.export.web import write_web_page

    write_web_page(tmp_path)
    source = (REPO / "export" / "web" / "index.html").read_text(encoding="utf-8")
    assert "<head>" not in source  # the head lives in prodip.base.page only
    assert (tmp_path / "index.html").read_text(encoding="utf-8") == render_page(source)


def test_the_playground_is_served_with_the_shared_head():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from prodip.serve.routes import playground_routes

    app = FastAPI()
    app.include_router(playground_routes)
    source = (REPO / "serve" / "playground.html").read_text(encoding="utf-8")
    assert "<head>" not in source
    reply = TestClient(app).get("/playground")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    assert reply.text == render_page(source)


def test_the_server_root_leads_to_the_playground():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from prodip.serve.routes import playground_routes

    app = FastAPI()
    app.include_router(playground_routes)
    reply = TestClient(app).get("/", follow_redirects=False)
    assert reply.status_code == 307 and reply.headers["location"] == "/playground"
    assert TestClient(app).get("/").text == TestClient(app).get("/playground").text
    kept = TestClient(app).get("/?prompt=x&autorun=1", follow_redirects=False)
    assert kept.headers["location"] == "/playground?prompt=x&autorun=1"  # the page's parameters kept


def _html_documents() -> list[tuple[str, str]]:
    """(where, text) of every HTML document prodip ships or tells a reader to save: page files as rendered,
    standalone ``.html`` files, and the docs' ``html`` code blocks."""
    import re

    docs = []
    for rel in ("export/web/index.html", "serve/playground.html"):
        docs.append((rel, render_page((REPO / rel).read_text(encoding="utf-8"))))
    for path in sorted((REPO / "bench").rglob("*.html")):
        docs.append((str(path.relative_to(REPO)), path.read_text(encoding="utf-8")))
    fence = re.compile(r"^```html[^\n]*\n(.*?)^```", re.S | re.M)
    for path in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        for i, m in enumerate(fence.finditer(path.read_text(encoding="utf-8"))):
            docs.append((f"{path.relative_to(REPO)} html block {i + 1}", m.group(1)))
    return docs


def test_every_html_document_declares_utf8_before_any_text():
    """A static server (``python -m http.server``) sends ``text/html`` without a charset; a page that does not
    declare UTF-8 itself has its Bangla prompt decoded as windows-1252 before it reaches the tokenizer."""
    docs = _html_documents()
    assert any("devices.md" in where for where, _ in docs)  # the "page of your own" snippet is among them
    for where, text in docs:
        head = text[:1024].lower()  # the HTML spec's prescan looks at the first 1024 bytes
        assert '<meta charset="utf-8">' in head, f'{where}: no <meta charset="utf-8"> in its first 1024 bytes'
        assert head.index('<meta charset="utf-8">') < min(
            (head.index(t) for t in ("<script", "<body", "<title") if t in head), default=len(head)
        ), f"{where}: the charset must come before any script, title or body"
