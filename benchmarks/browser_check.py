"""End-to-end check of the web page in a real headless browser (Debian's Chromium).

    python -m benchmarks.browser_check --screenshot docs/serve.png

Builds an index of ``examples/coral.jsonl`` (or uses ``--index``), starts ``agrame serve`` on a
free loopback port, loads ``/?q=…`` in headless Chromium (the page searches on load), and
checks in the DOM that the first hit outlines the sentence the API ranks first. With
``--screenshot`` it also saves a picture of that page. ``tests/test_browser.py`` runs the
same check with the tiny test model when Chromium is installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Optional

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def find_browser() -> Optional[str]:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``agrame serve``'s app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, app, timeouts=None):
        import uvicorn

        from agrame_app.serve.http import Timeouts, server_config

        self.port = _free_port()
        self.server = uvicorn.Server(server_config(app, "127.0.0.1", self.port, timeouts or Timeouts(),
                                                   log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "Server":
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _Outlined(HTMLParser):
    """Text inside the first ``class="best"`` element (nested token spans included) — the one of ``rank`` when
    given (a passage's outlines carry their hits' ranks)."""

    def __init__(self, rank: Optional[int] = None):
        super().__init__()
        self.depth = 0  # > 0 while inside the outline
        self.text: Optional[str] = None
        self._parts: list = []
        self.rank = rank

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self.depth:
            self.depth += 1
        elif self.text is None and "best" in (attrs.get("class") or "").split() and (
                self.rank is None or attrs.get("data-rank") == str(self.rank)):
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1
            if not self.depth:
                self.text = "".join(self._parts)

    def handle_data(self, data):
        if self.depth:
            self._parts.append(data)


def _outlined(fragment: str, rank: Optional[int] = None) -> Optional[str]:
    parser = _Outlined(rank)
    parser.feed(fragment)
    return parser.text


def _load(browser: str, page: str, profile: str, screenshot: Optional[Path] = None) -> str:
    """The DOM of ``page`` once its scripts have run (and a screenshot of it, when asked)."""
    common = FLAGS + [f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--window-size=1100,900"]
    dom = subprocess.run([browser, *common, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([browser, *common, f"--screenshot={screenshot.resolve()}", page], capture_output=True,
                       timeout=120, check=True)
    return dom


def check_page(app, query: str, browser: str, screenshot: Optional[Path] = None,
               filter: Optional[dict] = None) -> dict:
    """Load the page with ``query`` (and a metadata ``filter`` typed into its filter field) in the
    browser; return what the DOM and the API say."""
    import json

    with Server(app) as server, tempfile.TemporaryDirectory() as profile:
        body = {"query": query, "granularity": "sentence", "top_k": 3}
        params = {"q": query, "g": "sentence", "k": 3}
        if filter is not None:
            body["filter"], params["filter"] = filter, json.dumps(filter)
        request = urllib.request.Request(f"{server.url}/search", method="POST", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        api = json.loads(urllib.request.urlopen(request, timeout=60).read())
        dom = _load(browser, f"{server.url}/?" + urllib.parse.urlencode(params), profile, screenshot)
    hits = re.findall(r'<div class="hit" data-rank="([\d ]+)" data-passage="([^"]*)">(.*?)</details>', dom, re.S)
    first_best = _outlined(hits[0][2], 1) if hits else None
    # token-to-token explain: each query token's row names a passage token (data-s, its start) shown in the text
    pairs = [(re.findall(r'<tr class="pair" data-s="(\d+)"', h[2]), set(re.findall(r'class="tok[^"]*" data-s="(\d+)"', h[2])))
             for h in hits]
    return {"api_top": api["results"][0] if api["results"] else None, "dom_hits": len(hits),
            "dom_passages": [h[1] for h in hits], "dom_ranks": [[int(r) for r in h[0].split()] for h in hits],
            "dom_first_passage": hits[0][1] if hits else None, "dom_first_outlined": first_best,
            "dom_outlines": [len(re.findall(r'class="best"', h[2])) for h in hits],
            "dom_pair_rows": sum(len(rows) for rows, _ in pairs),
            "dom_pairs_unmatched": sum(r not in toks for rows, toks in pairs for r in rows),
            "api_passages": list(dict.fromkeys(h["passage_id"] for h in api["results"])),
            "searched": 'data-state="searched"' in dom}


def check_cite(app, answer: str, passages: list, browser: str, screenshot: Optional[Path] = None) -> dict:
    """Cite ``answer`` from ``passages`` on the page's Cite tab (``?answer=…&passages=…``); the markers the DOM
    shows after each sentence beside those the API gives (``markers``, sorted as ``agrame cite`` prints them),
    and whether each marker sits before the sentence's closing punctuation, as the CLI places it."""
    import json

    with Server(app) as server, tempfile.TemporaryDirectory() as profile:
        request = urllib.request.Request(f"{server.url}/cite", method="POST",
                                         data=json.dumps({"answer": answer, "passages": passages}).encode(),
                                         headers={"Content-Type": "application/json"})
        api = json.loads(urllib.request.urlopen(request, timeout=120).read())
        page = f"{server.url}/?" + urllib.parse.urlencode({"answer": answer, "passages": "\n".join(passages)})
        dom = _load(browser, page, profile, screenshot)
    sentences = re.findall(r'<span class="sent" data-sentence="(\d+)">(.*?)</span>(?= |$|<span class="sent")', dom,
                           re.S)
    dom_markers = [[int(m) for m in re.findall(r'<a class="marker"[^>]*>\[(\d+)\]</a>', body)] for _, body in sentences]
    before_stop = all(not re.search(r"</a>\s*\w", body) for _, body in sentences)
    return {"cited": 'data-state="cited"' in dom, "api_markers": [sorted(s["markers"]) for s in api["sentences"]],
            "dom_markers": dom_markers, "markers_before_closing_punctuation": before_stop,
            "duplicated": sum(len(m) - len(set(m)) for m in dom_markers), "favicon": 'rel="icon"' in dom}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", default=None, help="index folder (default: one built from examples/coral.jsonl)")
    parser.add_argument("--model", default=None, help="model (default: the index's, else the default model)")
    parser.add_argument("--query", default="What causes coral bleaching?")
    parser.add_argument("--screenshot", type=Path, default=None)
    args = parser.parse_args(argv)
    browser = find_browser()
    if browser is None:
        raise SystemExit("error: no Chromium found (apt-get install chromium)")
    from agrame_app.serve import create_app

    with tempfile.TemporaryDirectory() as tmp:
        index = args.index
        if index is None:
            from agrame.loading import load_encoder
            from agrame.index import build_index
            from agrame.io import read_passages

            repo = Path(__file__).resolve().parent.parent
            index = Path(tmp) / "coral"
            build_index(load_encoder(args.model), read_passages(str(repo / "examples" / "coral.jsonl")), index,
                        progress=False)
        result = check_page(create_app(index, model=args.model), args.query, browser, args.screenshot)
    ok = result["api_top"] is not None and result["dom_first_outlined"] == result["api_top"]["text"]
    print(result)
    print("page check:", "ok" if ok else "FAILED")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
