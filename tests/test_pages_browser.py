"""The built site as a reader sees it at a laptop's width: every page opened in headless
Chromium at 1280 x 800, laid out, and counted (tests/page_metrics.js does the counting):

* code and output blocks that scroll sideways (a source line or an output line the column
  does not hold): none;
* output blocks set smaller than the page's code (output shrunk to fit): none;
* table cells that split a word across two lines (a group name as ``TENSOR_MODEL_PARA`` /
  ``LLEL_GROUP``): none;
* text of a picture (an SVG figure) that runs past the picture's edge: none;
* pictures narrower than 95 % of the width their block leaves them, pictures whose smallest
  text is set below the page's code (0.5 px spare), pictures with two texts whose boxes share
  any area: none (issue #40: figures sat at 650 of 1030 px with 9 px print, and chapter 17's
  end labels crowded each other). Every picture is drawn to fill the column (svg.COLUMN), none
  narrower by design, so there is no exception to list.

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
import urllib.parse
from pathlib import Path

import pytest

from chromium import Browser, find_chromium

METRICS = (Path(__file__).parent / "page_metrics.js").read_text()

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no chromium installed (apt-get install chromium)")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would bury the test's own output
        pass


# A page that page_metrics.js must fault on every count of a picture: drawn at half a 1030 px
# column, its 9-unit text is 4.5 px, and its two labels share a line (a check that finds nothing
# on the built site is only worth as much as its failing here).
BAD_PICTURE = ('<div class="md-content"><article class="md-typeset" style="width:1030px">'
               '<figure class="minitron-figure" style="width:50%"><svg xmlns="http://www.w3.org/2000/svg" '
               'viewBox="0 0 1030 60" role="img" style="width:100%;height:auto" aria-label="bad">'
               '<text x="10" y="30" font-size="9">tp 4</text><text x="20" y="32" font-size="9">tp 8</text>'
               '</svg></figure></article></div>')


@pytest.fixture(scope="module")
def browsed(site_build):
    """({page: what page_metrics.js counted there}, for every page of the built site; what it
    counted on BAD_PICTURE)."""
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
        browser.open("data:text/html," + urllib.parse.quote(BAD_PICTURE))
        return found, browser.evaluate(METRICS)
    finally:
        browser.close()
        server.shutdown()


@pytest.fixture(scope="module")
def measured(browsed):
    return browsed[0]


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


# What each picture is held to (page_metrics.js measures it): the name of the finding, and the
# test of one picture (``f``) against its page (``m``).
FIGURE_CHECKS = {
    "narrow": ("pictures fill less than 95 % of their column",
               lambda f, m: f["width"] < 0.95 * f["room"], lambda f, m: f"{f['width']} of {f['room']} px"),
    "small print": ("pictures set text below the page's code size",
                    lambda f, m: f["smallest"] < m["reference"] - 0.5,
                    lambda f, m: f"{f['smallest']} px against {m['reference']} px: {f['smallestText']!r}"),
    "overlapping": ("pictures have texts on top of each other", lambda f, m: f["overlaps"],
                    lambda f, m: "; ".join(" / ".join(map(repr, pair)) for pair in f["overlaps"][:3])),
}


def test_the_pictures_were_measured(measured):
    """The pictures of chapters 6, 11 and 17 at least (so a selector that finds none fails here)."""
    pictures = {page: len(m["figures"]) for page, m in measured.items() if m["figures"]}
    assert all(pictures.get(f"walkthrough/{page}") for page in
               ("06-process-groups", "11-pipeline-schedules", "17-what-a-layout-costs")), pictures
    assert sum(pictures.values()) >= 10, pictures


@pytest.mark.parametrize("kind", FIGURE_CHECKS)
def test_no_picture_is(measured, kind):
    what, bad, where = FIGURE_CHECKS[kind]
    found = [f"{page}: {f['label']!r}: {where(f, m)}" for page, m in measured.items() for f in m["figures"]
             if bad(f, m)]
    assert not found, f"{len(found)} {what}:\n" + "\n".join(found[:20])


def test_a_bad_picture_is_caught(browsed):
    """BAD_PICTURE fails every check of a picture, so that they are known to fail."""
    probe = browsed[1]
    assert len(probe["figures"]) == 1, probe
    bad = [kind for kind, (_, is_bad, _) in FIGURE_CHECKS.items() if is_bad(probe["figures"][0], probe)]
    assert bad == list(FIGURE_CHECKS), probe["figures"]
