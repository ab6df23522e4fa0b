"""`mkb report`'s HTML renders in a real browser: headless Chromium screenshots a page that is not blank, decodes
every embedded plot (img.complete and naturalWidth > 0), and lays out every table of the report.

Needs Chromium (Debian: `apt-get install chromium`; .ci/run installs it). Without it the test fails, never skips."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys

import pytest

from test_report import make_store  # noqa: E402  (tests/ is on sys.path under pytest's default import mode)

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
IMG = re.compile(r'<img alt="[^"]+" src="data:image/png;base64,[A-Za-z0-9+/=]+">')


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed to render the report: install it with `apt-get install chromium` "
                "(Debian; .ci/run does this)")


def _run_chromium(tmp_path, tag: str, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{tag}"  # a fresh profile per call
    proc = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("render")
    make_store(tmp / "s.sqlite").close()
    proc = subprocess.run([sys.executable, "-m", "metakernelbench", "report", "--db", str(tmp / "s.sqlite"),
                           "--out", str(tmp / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return tmp / "out"


def test_screenshot_is_not_blank(report_dir, tmp_path):
    from matplotlib import image

    shot = tmp_path / "report.png"
    _run_chromium(tmp_path, "shot", f"--screenshot={shot}", "--window-size=1400,5000",
                  (report_dir / "report.html").as_uri())
    assert shot.exists() and shot.stat().st_size > 0, "chromium wrote no screenshot"
    px = image.imread(str(shot))[..., :3]  # floats in [0, 1]
    assert px.shape[:2] == (5000, 1400), px.shape
    assert float(px.std()) > 0.05, f"screenshot is blank (pixel std {px.std():.4f})"
    inked = (px.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    assert inked > 0.01, f"screenshot is almost all white ({inked:.2%} inked)"
    coloured = (px.max(axis=2) - px.min(axis=2) > 0.2).mean()  # the plots are in colour; text and tables are not
    assert coloured > 0.001, f"no colour in the screenshot ({coloured:.3%}): the plots did not render"


def test_every_plot_decodes(report_dir, tmp_path):
    page = (report_dir / "report.html").read_text()
    imgs = IMG.findall(page)
    names = json.loads((report_dir / "report.json").read_text())["plots"]
    assert len(imgs) == len(names) >= 5, (len(imgs), names)
    # A page of the report's own <img> tags and a script that writes, on load, whether each one decoded.
    probe = tmp_path / "probe.html"
    probe.write_text(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>\n" + "\n".join(imgs) +
        "\n<pre id=\"result\">pending</pre><script>window.addEventListener('load', () => {"
        "document.getElementById('result').textContent = 'RESULT=' + JSON.stringify(Array.from("
        "document.images, i => [i.alt, i.complete && i.naturalWidth > 0, i.naturalWidth, i.naturalHeight]));"
        "});</script></body></html>\n")
    dom = _run_chromium(tmp_path, "probe", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r"RESULT=(\[.*?\])</pre>", dom)
    assert found, f"the probe's script did not run: {dom[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    assert {alt for alt, *_ in result} == set(names)
    bad = [(alt, w, h) for alt, ok, w, h in result if not ok]
    assert not bad, f"images that did not decode (alt, width, height): {bad}"
    assert all(w >= 100 and h >= 100 for _, _, w, h in result), result


def test_every_table_is_in_the_rendered_dom(report_dir, tmp_path):
    page = (report_dir / "report.html").read_text()
    dom = _run_chromium(tmp_path, "dom", "--virtual-time-budget=10000", "--dump-dom",
                        (report_dir / "report.html").as_uri()).stdout

    def tables(text: str) -> list[tuple[str, int, int]]:
        """(title, header cells, body rows) of every table, in order."""
        out = []
        for title, body in re.findall(r"<h2>(.*?)</h2>\s*<table[^>]*>(.*?)</table>", text, flags=re.S):
            out.append((html.unescape(title), len(re.findall(r"<th[ >]", body)), len(re.findall(r"<tr[ >]", body))))
        return out

    source, rendered = tables(page), tables(dom)
    assert len(source) == page.count("<table") >= 10
    assert rendered == source, (source, rendered)
    assert dom.count("<img") == page.count("<img") and "<h1>" in dom
