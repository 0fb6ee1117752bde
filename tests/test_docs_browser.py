"""The documentation site in a real headless browser (issue 27, item 4): Debian's Chromium
driven by Playwright, against the strictly built site served on localhost. Checks the home
page, the API reference of posenc.attention, search finding "yarn", math rendered by the
bundled KaTeX, every image loaded, and no console error or failed request on any page
visited (the site must work offline: nothing is fetched from outside).

Skipped with the reason where the `docs` extra, Playwright or a Chromium executable is
missing (`apt-get install chromium`; Playwright drives the system's browser, it downloads none).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest
from conftest import missing_docs_packages

# the site fixture is conftest's: one strict build a session, shared with tests/test_docs_site.py

ROOT = Path(__file__).resolve().parents[1]
#: Where Debian and Ubuntu put Chromium; CHROMIUM overrides.
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
#: Chromium's flags for a closed network as root: without the background-networking ones it
#: keeps trying to reach Google's hosts (refused here: console noise and slow starts).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def _browser() -> str | None:
    return os.environ.get("CHROMIUM") or next((path for name in BROWSERS if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def served_site(request):
    missing = missing_docs_packages()
    if missing:
        pytest.skip(f"the docs extra is not installed: missing {', '.join(missing)}")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if _browser() is None:
        pytest.skip("no Chromium executable (apt-get install chromium, or set CHROMIUM=/path/to/chrome)")
    out = request.getfixturevalue("site")  # test_docs_site's strict build, shared
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the test's output, not the server's log
            pass

    handler = functools.partial(Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(served_site):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=_browser(), headless=True, args=FLAGS)
        yield chromium
        chromium.close()


class Page:
    """A page opened in the browser with every console error, page error and failed request
    recorded (:attr:`problems`)."""

    def __init__(self, browser, url: str):
        self.page = browser.new_page()
        self.problems: list[str] = []
        self.page.on("console", lambda message: message.type == "error" and self.problems.append(f"console: {message.text}"))
        self.page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        self.page.on("requestfailed", lambda request: self.problems.append(f"request failed: {request.url}"))
        self.page.goto(url, wait_until="networkidle")

    def images_not_loaded(self) -> list[str]:
        return self.page.eval_on_selector_all("img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")


def test_home_page(browser, served_site):
    page = Page(browser, f"{served_site}/index.html")
    assert "posenc" in page.page.title()
    assert page.page.locator("nav.md-nav").count() > 0  # Material's navigation was rendered
    assert page.images_not_loaded() == [] and page.problems == []


def test_api_reference_of_posenc_attention(browser, served_site):
    page = Page(browser, f"{served_site}/api/attention.html")
    text = page.page.locator("article").inner_text()
    assert "posenc.attention" in text and "backend" in text  # the docstring of attention(), rendered
    assert page.page.locator(".doc-function, .doc-object").count() > 0
    assert page.problems == []


def test_search_finds_yarn(browser, served_site):
    page = Page(browser, f"{served_site}/index.html")
    page.page.keyboard.press("s")  # Material's shortcut: focus the search box
    page.page.keyboard.type("yarn", delay=50)  # typed key by key: the search runs on key events
    results = page.page.locator(".md-search-result__item")
    results.first.wait_for(timeout=15000)
    assert results.count() > 0 and "yarn" in results.first.inner_text().lower()
    assert page.problems == []


def test_math_is_rendered_and_every_image_loads(browser, served_site):
    for name in ("families/rotary.html", "families/bias.html", "families/absolute.html", "results.html"):
        page = Page(browser, f"{served_site}/{name}")
        if name.startswith("families/"):
            page.page.locator(".katex").first.wait_for(timeout=10000)
            assert page.page.locator(".katex").count() > 0, name
            assert page.page.locator(".katex-error").count() == 0, name
        assert page.images_not_loaded() == [], name
        assert page.problems == [], (name, page.problems)
