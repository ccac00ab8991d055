"""The built site as a reader sees it at a laptop's width: every page opened in headless
Chromium at 1280 x 800, laid out, and counted (tests/page_metrics.js does the counting):

* code and output blocks that scroll sideways (a source line or an output line the column
  does not hold): none;
* output blocks set smaller than the page's code (output shrunk to fit): none;
* table cells that split a word across two lines (a group name as ``TENSOR_MODEL_PARA`` /
  ``LLEL_GROUP``): none;
* text of a picture (an SVG figure) that runs past the picture's edge: none.

It reads the site that the suite builds once (tests/conftest.py starts the build when the
tests are collected), served over HTTP from a thread, so no page is built twice. Without
Chromium it is skipped, saying so; .ci/run installs Chromium first.

The fonts: Material asks Google Fonts for Roboto Mono, which this offline browser cannot
reach, so code falls back to the system's monospace (DejaVu Sans Mono or Liberation Mono).
All three advance 0.6 em per character, so the column holds the same count either way.
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from chromium import Browser, find_chromium

METRICS = (Path(__file__).parent / "page_metrics.js").read_text()

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no chromium installed (apt-get install chromium)")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would bury the test's own output
        pass


@pytest.fixture(scope="module")
def measured(site_build):
    """{page: what page_metrics.js counted there}, for every page of the built site."""
    site, code, stdout, stderr = site_build
    if code != 0:
        pytest.fail(f"the site did not build (test_docs.py::test_site_builds_strict says why):\n{stderr[-2000:]}")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = Browser(width=1280, height=800)
    try:
        pages = sorted(p.parent.relative_to(site) for p in site.rglob("index.html") if "assets" not in p.parts)
        found = {}
        for page in pages:
            browser.open(f"http://127.0.0.1:{server.server_port}/{page.as_posix()}/".replace("/./", "/"))
            found[str(page)] = browser.evaluate(METRICS)
        return found
    finally:
        browser.close()
        server.shutdown()


def test_the_pages_were_measured(measured):
    assert "walkthrough/06-process-groups" in measured and "gallery" in measured
    assert sum(m["blocks"] for m in measured.values()) > 200, "the pages have almost no code blocks"
    assert all(m["window"] == 1280 for m in measured.values())


def _where(found: dict) -> str:
    return f"{found['over']} px too wide: {found['first']!r}"


# What page_metrics.js lists, what each finding is, and how to say where it is.
CHECKS = {
    "scrolling": ("code or output blocks scroll sideways at 1280 px", lambda b, m: _where(b)),
    "tables": ("tables scroll sideways at 1280 px", lambda t, m: _where(t)),
    "small": ("output blocks are set below the code's size",
              lambda b, m: f"{b['size']} px against {m['reference']} px: {b['first']!r}"),
    "split": ("words are split across two lines in table cells", lambda word, m: repr(word)),
    "clipped": ("picture texts run past their picture's edge", lambda t, m: _where(t)),
}


@pytest.mark.parametrize("kind", CHECKS)
def test_no_page_has_any(measured, kind):
    what, where = CHECKS[kind]
    found = [f"{page}: {where(item, m)}" for page, m in measured.items() for item in m[kind]]
    assert not found, f"{len(found)} {what}:\n" + "\n".join(found[:20])
