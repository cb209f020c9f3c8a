"""The web page of `tmt serve` in a real browser: headless Chromium loads `/?q=...`, runs the
page's script against the running server, and the rendered DOM must show the translation and
the attention heatmap. Skipped only where no Chromium is installed (scripts/setup.sh installs
Debian's `chromium` when run as root)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest
from server_process import TmtServer

from transformer_mt.translator import Translator

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (scripts/setup.sh "
                                "installs it as root)")


def rendered_dom(url: str) -> str:
    """The DOM after the page's scripts ran: the virtual-time budget lets the fetches finish."""
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=20000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def element_text(dom: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</div>', dom, re.S)
    assert found, f"no #{element_id} in the page"
    return found.group(1)


def test_page_translates_the_q_parameter_in_a_browser(varied_model: Path):
    sentence = "Where is the station?"
    expected = Translator.from_checkpoint(varied_model, "cpu").translate([sentence])[0]
    assert expected
    served = TmtServer("--checkpoint", str(varied_model), "--device", "cpu")
    try:
        dom = rendered_dom(f"{served.url}/?q={urllib.parse.quote(sentence)}")
    finally:
        assert served.terminate() == 0, served.stderr
    assert element_text(dom, "error") == ""
    assert element_text(dom, "translation") == html.escape(expected, quote=False)
    assert re.search(r'id="model">[^<]*step 6<', dom), "the page names the model it uses"
    # One sentence: the cross-attention heatmap is drawn, one row per output token + [EOS].
    heatmap = re.search(r'<table class="heatmap">(.*?)</table>', dom, re.S)
    assert heatmap, "no attention heatmap"
    assert heatmap.group(1).count("<tr>") >= 2
