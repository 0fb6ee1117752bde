"""The documentation site builds strictly and works offline (issue 27, items 1-2).

`mkdocs build --strict` (mkdocs.yml) fails on a broken link or anchor, a page outside the
nav, a mkdocstrings reference that does not resolve or a docstring griffe cannot parse. Skipped
with the reason when the `docs` extra (mkdocs-material, mkdocstrings-python) is not installed.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit


class _Refs(HTMLParser):
    """Every src of script/img and href of link (stylesheets, icons) in a page."""

    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img") and attrs.get("src"):
            self.refs.append((tag, attrs["src"]))
        if tag == "link" and attrs.get("href"):
            self.refs.append((tag, attrs["href"]))


def test_pages_of_the_nav_are_built(site: Path):
    for page in ["index.html", "choose.html", "results.html", "integration.html", "api/posenc.html",
                 "api/attention.html", "api/rope.html", "api/transformers.html", "api/lab.html",
                 "families/index.html", "families/rotary.html", "families/bias.html"]:
        assert (site / page).is_file(), page
    api = (site / "api/attention.html").read_text(encoding="utf-8")
    assert 'id="posenc.attention.attention"' in api          # the function's entry, from its docstring
    assert "Scaled dot-product attention with a positional encoding" in api


def test_nothing_is_fetched_from_another_host(site: Path):
    """Every script, stylesheet and image of every page is a file of the site; KaTeX's CSS
    names its fonts by relative URLs that exist (woff2: what browsers ask for first)."""
    for page in site.rglob("*.html"):
        parser = _Refs()
        parser.feed(page.read_text(encoding="utf-8"))
        for tag, ref in parser.refs:
            parts = urlsplit(ref)
            assert not parts.scheme and not parts.netloc, f"{page.relative_to(site)}: <{tag}> {ref}"
            # 404.html names its assets from the site's root (it is served at any depth)
            target = site / parts.path.lstrip("/") if parts.path.startswith("/") else (page.parent / parts.path).resolve()
            assert target.exists(), f"{page.relative_to(site)}: <{tag}> {ref} is not in the site"
    css = (site / "assets/katex/katex.min.css").read_text(encoding="utf-8")
    fonts = re.findall(r"url\((fonts/[^)]+\.woff2)\)", css)
    assert fonts and all((site / "assets/katex" / f).is_file() for f in fonts)
    assert not re.search(r"url\(\s*['\"]?https?:", css)


def test_math_is_left_for_the_bundled_katex(site: Path):
    page = (site / "families/rotary.html").read_text(encoding="utf-8")
    assert page.count('class="arithmatex"') >= 3
    assert "assets/katex/katex.min.js" in page and "javascripts/katex-init.js" in page
