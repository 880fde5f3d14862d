"""The dashboard and the JSON behind it, on real servers; the page in a real headless Chromium.

The browser test needs Debian's ``chromium``: the session fixture installs it with apt-get
when it is missing (as root, which CI is), or uses ``$CHROME_BIN``. Chromium runs headless
with --no-sandbox (root), loads /dashboard from a live daemon with parked sessions, one
live peer and two peers that are down (one refuses, one never answers), lets the page's
script run (--virtual-time-budget), and the test reads the rendered DOM (--dump-dom) and
saves a screenshot under the test's tmp dir.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from agentpark.config import Settings
from agentpark.status import human_bytes, human_ms, print_status
from tests.harness import Daemon

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # as root there is no other way; the page is our own
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
)


# ---- Chromium ---------------------------------------------------------------------------


def _find_chromium() -> str | None:
    configured = os.environ.get("CHROME_BIN")
    if configured:
        return configured if shutil.which(configured) else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _install_chromium() -> str:
    """apt-get install Debian's chromium (the test set-up of a fresh machine)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(
            "the dashboard test needs Chromium: install Debian's `chromium` package "
            "(apt-get install chromium, as root) or point $CHROME_BIN at a Chrome binary"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found = _find_chromium()
    if found is None:
        pytest.fail("apt-get installed chromium, but no chromium binary is on PATH")
    return found


@dataclass
class Chromium:
    binary: str
    profiles: Path

    # Virtual time stands still while a fetch is pending, so the first refresh always lands;
    # 3 s lets the main test's page (refresh_s=2) refresh twice. Each of its refreshes waits
    # for the silent peer's timeout in real time, hence no more than that.
    def run(self, url: str, *extra: str, budget_ms: int = 3_000) -> str:
        profile = self.profiles / f"profile-{time.monotonic_ns()}"
        argv = [
            self.binary,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",  # timers and fetches run, then it stops
            *extra,
            url,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}"
        return done.stdout

    def dump_dom(self, url: str) -> str:
        return self.run(url, "--window-size=1400,1000", "--dump-dom")

    def screenshot(self, url: str, path: Path, width: int, height: int) -> None:
        self.run(url, f"--window-size={width},{height}", f"--screenshot={path}")


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Chromium:
    binary = _find_chromium() or _install_chromium()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    return Chromium(binary, tmp_path_factory.mktemp("chromium"))


# ---- reading the rendered page ------------------------------------------------------------


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Node] = field(default_factory=list)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


class _Tree(HTMLParser):
    VOID = frozenset({"meta", "link", "br", "img", "input", "hr", "col", "source", "area", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].text += data


def parse_html(text: str) -> Node:
    tree = _Tree()
    tree.feed(text)
    tree.close()
    return tree.root


def lookup(data: Any, path: str) -> Any:
    for part in path.split("."):
        if data is None:  # a section this daemon does not have (pins: no vLLM)
            return None
        data = data[part]
    return data


def same_number(shown: str, expected: Any) -> bool:
    if expected is None:
        return shown == ""
    return float(shown) == float(expected)


# ---- helpers ------------------------------------------------------------------------------


def refused_url() -> str:
    """A loopback port nobody listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A peer that accepts connections (the kernel does) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def workload(daemon: Daemon, count: int, now: float, step_s: float = 30.0) -> None:
    """Sessions of growing size, most of them parked, some resumed; a sample after each.

    Samples are written with explicit times, ``step_s`` apart and ending just before
    ``now``, so the charts have one point per step whatever the wall clock did.
    """
    c = daemon.client
    for i in range(count):
        sid = f"agent-{i:02d}"
        assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
        prompt = {"prompt": "Plan the trip. " * (1 + i % 4), "max_new_tokens": 6 + 3 * i}
        assert c.post(f"/v1/sessions/{sid}/generate", json=prompt).status_code == 200
        if i % 4 != 3:
            pause = {"tool": "web_search", "force": True}  # park, whatever the policy says
            paused = c.post(f"/v1/sessions/{sid}/pause", json=pause)
            assert paused.status_code == 200, paused.text
        if i % 5 == 1:
            assert c.post(f"/v1/sessions/{sid}/resume").status_code == 200
        daemon.runtime.sampler.sample(now=now - (count - i) * step_s)


def _quiet(**dashboard: Any) -> dict[str, Any]:
    """Dashboard settings with no background samples (the test writes them)."""
    return {"sample_interval_s": 3600.0, "downsample": [], **dashboard}


# No policy loop: what is parked is what the test parked.
NO_POLICY = {"enabled": False}


# ---- the page in Chromium -----------------------------------------------------------------


@pytest.mark.timeout(1200)  # a fresh machine installs chromium first
def test_dashboard_in_headless_chromium_shows_the_host_its_history_and_down_peers(
    chromium: Chromium,
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
    tmp_path: Path,
    silent_url: str,
) -> None:
    peer = daemon_factory(
        make_settings(
            state_dir=tmp_path / "peer",
            tiers={"shm": {"path": shm_dir / "peer"}},
            policy=NO_POLICY,
            dashboard=_quiet(host_label="gpu-node-2"),
        )
    )
    refused = refused_url()
    main = daemon_factory(
        make_settings(
            policy=NO_POLICY,
            dashboard=_quiet(
                host_label="gpu-node-1",
                peers=[peer.url, refused, silent_url],
                peer_timeout_s=0.5,
                refresh_s=2.0,
            ),
        )
    )
    now = time.time()
    count = 16
    workload(main, count, now)
    for i in range(count):  # the peer: a different shape, every other session parked
        sid = f"p{i}"
        peer.client.post("/v1/sessions", json={"session_id": sid})
        peer.client.post(f"/v1/sessions/{sid}/generate", json={"max_new_tokens": 20, "prompt": "x"})
        if i % 2:
            peer.client.post(f"/v1/sessions/{sid}/pause")
        peer.runtime.sampler.sample(now=now - (count - i) * 30.0)

    page = f"{main.url}/dashboard#range=900"  # the last 15 minutes
    dom = parse_html(chromium.dump_dom(page))
    c = main.client
    host = c.get("/v1/host").json()
    latency = c.get("/v1/host/latency", params={"window_s": 900}).json()
    parked = c.get("/v1/host/parked", params={"limit": 10}).json()
    nodes = list(dom.walk())

    (body,) = [n for n in nodes if n.tag == "body"]
    assert body.attrs["data-state"] == "ready", "the page's script did not finish a refresh"
    assert int(body.attrs["data-refreshes"]) >= 1
    windows = {n.all_text() for n in nodes if n.attrs.get("class") == "window"}
    assert windows == {"last 15 min"}, "the page did not take its range from the URL"
    banner = next(n for n in nodes if n.attrs.get("id") == "banner")
    assert "hidden" in banner.attrs

    # Every figure on the page equals what the daemon says.
    figures = [n for n in nodes if "data-figure" in n.attrs]
    shown: dict[tuple[str, str], str] = {}
    for node in figures:
        key = (node.attrs["data-source"], node.attrs["data-figure"])
        assert "data-value" in node.attrs, f"figure {key} was never filled in"
        shown[key] = node.attrs["data-value"]
    sources = {"host": host, "latency": latency}
    for (source, path), value in shown.items():
        assert same_number(value, lookup(sources[source], path)), (source, path, value)
    expected = {
        ("host", "reclaimed_bytes"),
        ("host", "pool.used_bytes"),
        ("host", "pool.total_bytes"),
        ("host", "sessions.parked"),
        ("host", "sessions.active"),
        ("latency", "pause.p50_ms"),
        ("latency", "pause.p99_ms"),
        ("latency", "resume.p50_ms"),
        ("latency", "resume.p99_ms"),
        ("latency", "pause.bytes_per_s"),
    } | {("host", f"tiers.{name}.used_bytes") for name in host["tiers"]}
    assert expected <= shown.keys()
    assert host["reclaimed_bytes"] > 0 and host["sessions"]["parked"] >= 8
    paused_steps = len([i for i in range(count) if i % 4 != 3])
    assert latency["pause"]["count"] == paused_steps and latency["resume"]["count"] == 2
    headline = next(n for n in figures if n.attrs["data-figure"] == "reclaimed_bytes")
    assert headline.all_text().strip() == _js_bytes(host["reclaimed_bytes"])

    # The charts have data points: one per sample written.
    charts = {n.attrs["data-chart"]: n for n in nodes if n.tag == "svg" and "data-chart" in n.attrs}
    assert set(charts) == {
        "chart-hbm",
        "chart-sessions",
        "chart-latency",
        "chart-bandwidth",
        "chart-hosts",
    }
    for name, chart in charts.items():
        assert int(chart.attrs["data-points"]) > 0, f"{name} is empty"

    def series(chart: str) -> dict[str, int]:
        return {
            n.attrs["data-series"]: int(n.attrs["data-points"])
            for n in charts[chart].walk()
            if n.tag == "path" and "data-series" in n.attrs
        }

    assert series("chart-hbm")["HBM reclaimed"] == count
    assert series("chart-hbm")["HBM used"] == count
    assert series("chart-sessions")["parked"] == count
    assert series("chart-latency")["pause p50"] == paused_steps
    assert series("chart-latency")["resume p99"] == 2
    assert series("chart-bandwidth")["park (to host)"] == paused_steps
    per_host = series("chart-hosts")
    assert per_host["gpu-node-1 (this host)"] == count
    assert per_host["gpu-node-2"] == count

    # The hosts table: this host and the live peer with their figures, the others down.
    rows = {n.attrs["data-host-url"]: n for n in nodes if n.tag == "tr" and "data-up" in n.attrs}
    assert set(rows) == {"", peer.url, refused, silent_url}
    assert rows[""].attrs["data-up"] == "true"
    peer_host = peer.client.get("/v1/host").json()
    assert rows[peer.url].attrs["data-up"] == "true"
    peer_figures = [n.attrs["data-value"] for n in rows[peer.url].walk() if "data-value" in n.attrs]
    assert peer_figures == [str(peer_host["reclaimed_bytes"])]
    for url in (refused, silent_url):
        row = rows[url]
        assert row.attrs["data-up"] == "false"
        assert "down" in row.all_text()
        # Down is not zero: no figure at all for it, nor a line in the chart.
        assert not any("data-value" in n.attrs for n in row.walk())
        assert "0 B" not in row.all_text()
    legend = [n.all_text() for n in nodes if n.tag == "span" and n.attrs.get("class") == "down"]
    assert len(legend) == 2

    # Largest parked sessions, largest first, as the daemon lists them.
    table = next(n for n in nodes if n.attrs.get("id") == "parked")
    listed = [n.attrs["data-session"] for n in table.walk() if "data-session" in n.attrs]
    assert listed == [f"{s['tenant']}/{s['session_id']}" for s in parked["sessions"]]
    sizes = [int(n.attrs["data-kv-bytes"]) for n in table.walk() if "data-kv-bytes" in n.attrs]
    assert sizes == sorted(sizes, reverse=True) and len(sizes) == 10

    # The artifact: a screenshot of the page as an operator sees it.
    shot = tmp_path / "dashboard.png"
    chromium.screenshot(page, shot, 1400, 1000)
    full = tmp_path / "dashboard-full.png"
    chromium.screenshot(page, full, 1400, 1560)
    for path, size in ((shot, (1400, 1000)), (full, (1400, 1560))):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", data[16:24]) == size
        assert len(data) > 30_000, "a blank page compresses to almost nothing"


def _js_bytes(n: int) -> str:
    """What the page's fmtBytes prints (checked against the headline figure)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, i = float(abs(n)), 0
    while v >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    digits = 0 if i == 0 or v >= 100 else 1
    return f"{v:.{digits}f} {units[i]}"


@pytest.mark.timeout(1200)  # a fresh machine installs chromium first
def test_dashboard_in_chromium_asks_for_a_token_and_uses_one_from_the_fragment(
    chromium: Chromium,
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[..., Daemon],
) -> None:
    daemon = daemon_factory(make_settings(policy=NO_POLICY, dashboard=_quiet()))
    token = daemon.token("ops", "operator")  # from now on the data calls need one
    nodes = list(parse_html(chromium.dump_dom(f"{daemon.url}/dashboard#range=900")).walk())
    (body,) = [n for n in nodes if n.tag == "body"]
    assert body.attrs["data-state"] == "auth"
    banner = next(n for n in nodes if n.attrs.get("id") == "banner")
    assert "hidden" not in banner.attrs and "operator scope" in banner.all_text()
    form = next(n for n in nodes if n.attrs.get("id") == "token-form")
    assert "hidden" not in form.attrs
    # The token in the fragment: kept in sessionStorage, sent as a header, and gone from
    # the address (the range stays).
    page = f"{daemon.url}/dashboard#range=900&token={token}"
    nodes = list(parse_html(chromium.dump_dom(page)).walk())
    (body,) = [n for n in nodes if n.tag == "body"]
    assert body.attrs["data-state"] == "ready"
    assert {n.all_text() for n in nodes if n.attrs.get("class") == "window"} == {"last 15 min"}
    assert token not in "".join(n.all_text() for n in nodes)


# ---- the page and the JSON, without a browser ---------------------------------------------


def test_dashboard_page_is_one_self_contained_document(daemon: Daemon) -> None:
    page = daemon.client.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    text = page.text
    assert "/*STYLE*/" not in text and "/*SCRIPT*/" not in text
    assert "function lineChart" in text and "--accent" in text  # inlined
    # Nothing from outside the daemon: no external script, stylesheet, font or image.
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=", text, re.IGNORECASE)
    assert not re.search(r"url\(|@import|https?://(?!www\.w3\.org/2000/svg)", text)
    # Every path the script fetches is served.
    paths = set(re.findall(r'getJSON\("(/[^"?]*)', text))
    assert paths == {
        "/v1/host",
        "/v1/host/history",
        "/v1/host/latency",
        "/v1/host/parked",
        "/v1/peers",
    }
    for path in paths:
        assert daemon.client.get(path).status_code == 200, path


def test_peers_that_refuse_or_never_answer_are_down_and_have_no_figures(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    silent_url: str,
) -> None:
    refused = refused_url()
    timeout = 0.3
    daemon = daemon_factory(
        make_settings(dashboard={"peers": [refused, silent_url], "peer_timeout_s": timeout})
    )
    started = time.monotonic()
    answer = daemon.client.get("/v1/peers", params={"since": -600})
    elapsed = time.monotonic() - started
    assert answer.status_code == 200
    hosts = answer.json()["hosts"]
    assert [h["url"] for h in hosts] == [None, refused, silent_url]
    me, *peers = hosts
    assert me["self"] and me["up"] and me["host"]["pool"]["total_blocks"] == 64
    for peer in peers:
        assert peer["up"] is False and not peer["self"]
        assert peer["host"] is None and peer["history"] is None  # never zeros
        assert peer["error"]
    assert "refused" in peers[0]["error"]
    assert any(w in peers[1]["error"] for w in ("in time", "timed out", "within"))
    # Bounded by the peer timeout, not by the peer (generous for a noisy machine).
    assert elapsed < 2 * timeout + 10


def test_a_live_peer_is_up_with_its_figures_and_history(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
    tmp_path: Path,
) -> None:
    peer = daemon_factory(
        make_settings(
            state_dir=tmp_path / "peer",
            tiers={"shm": {"path": shm_dir / "peer"}},
            policy=NO_POLICY,
            dashboard=_quiet(host_label="peer-host"),
        )
    )
    now = time.time()
    workload(peer, 3, now, step_s=10.0)
    main = daemon_factory(make_settings(policy=NO_POLICY, dashboard=_quiet(peers=[peer.url + "/"])))
    hosts = main.client.get("/v1/peers", params={"since": -3600, "step": 5}).json()["hosts"]
    entry = hosts[1]
    assert (entry["name"], entry["url"], entry["up"], entry["error"]) == (
        "peer-host",
        peer.url,
        True,
        None,
    )
    assert entry["host"]["reclaimed_bytes"] == peer.client.get("/v1/host").json()["reclaimed_bytes"]
    own = peer.client.get("/v1/host/history", params={"since": -3600}).json()["samples"]
    assert [s["reclaimed_bytes"] for s in entry["history"]] == [s["reclaimed_bytes"] for s in own]
    assert len(entry["history"]) == 3


def test_history_endpoint_windows_and_steps(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(
        make_settings(policy=NO_POLICY, dashboard=_quiet(host_label="h1", refresh_s=7))
    )
    sampler = daemon.runtime.sampler
    now = time.time()
    for k in range(6):
        sampler.sample(now=now - 60 + 10 * k)  # -60, -50, .., -10
    c = daemon.client
    body = c.get("/v1/host/history", params={"since": -45}).json()
    assert [round(s["at"] - now) for s in body["samples"]] == [-40, -30, -20, -10]
    assert body["interval_s"] == 3600.0 and body["step_s"] == 3600.0
    assert (body["host"], body["refresh_s"]) == ("h1", 7.0)
    assert body["until"] - body["since"] == pytest.approx(45)
    absolute = c.get("/v1/host/history", params={"since": now - 65, "until": now - 35}).json()
    assert len(absolute["samples"]) == 3
    # A step merges samples on the fly (rounded up to whole sampling intervals).
    stepped = c.get("/v1/host/history", params={"since": -7200, "step": 5000}).json()
    assert stepped["step_s"] == 7200.0
    assert 1 <= len(stepped["samples"]) <= 2 and sum(s["n"] for s in stepped["samples"]) == 6
    # A window that ends before it starts is empty, not an error (the spec allows it).
    backwards = c.get("/v1/host/history", params={"since": now, "until": now - 10})
    assert backwards.status_code == 200 and backwards.json()["samples"] == []
    for params in ({"step": -1}, {"since": "soon"}):
        bad = c.get("/v1/host/history", params=params)
        assert bad.status_code == 422, params
        assert bad.json()["error"]["code"] == "invalid_request"


def test_parked_lists_the_largest_first_across_tenants(daemon: Daemon) -> None:
    c = daemon.client
    daemon.admin()  # tokens from here on: the client is tenant default with every scope
    tokens_of = {tenant: daemon.token(tenant, "sessions") for tenant in ("a", "b")}
    sizes = {}
    for tenant, sid, tokens in (("a", "small", 10), ("b", "large", 90), ("a", "mid", 40)):
        headers = {"Authorization": f"Bearer {tokens_of[tenant]}"}
        c.post("/v1/sessions", json={"session_id": sid}, headers=headers)
        c.post(
            f"/v1/sessions/{sid}/generate",
            json={"prompt_tokens": [1] * tokens, "max_new_tokens": 1},
            headers=headers,
        )
        paused = c.post(
            f"/v1/sessions/{sid}/pause", json={"tool": "t", "force": True}, headers=headers
        )
        sizes[sid] = paused.json()["kv_bytes"]
    c.post("/v1/sessions", json={"session_id": "active"})
    body = c.get("/v1/host/parked", params={"limit": 2}).json()
    assert body["count"] == 3 and body["bytes"] == sum(sizes.values())
    assert [(s["tenant"], s["session_id"]) for s in body["sessions"]] == [
        ("b", "large"),
        ("a", "mid"),
    ]
    assert body["sessions"][0]["kv_bytes"] == sizes["large"] and body["sessions"][0]["tool"] == "t"
    assert c.get("/v1/host/parked", params={"limit": 0}).status_code == 422


def test_latency_endpoint_reads_the_events(daemon: Daemon) -> None:
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "l"})
    c.post("/v1/sessions/l/generate", json={"prompt": "latency", "max_new_tokens": 20})
    for _ in range(3):
        c.post("/v1/sessions/l/pause")
        c.post("/v1/sessions/l/resume")
    events = c.get("/v1/events", params={"session_id": "l"}).json()["events"]
    pauses = sorted(e["duration_ms"] for e in events if e["kind"] == "pause")
    resumes = sorted(e["duration_ms"] for e in events if e["kind"] == "resume")
    body = c.get("/v1/host/latency", params={"window_s": 600}).json()
    assert body["pause"]["count"] == 3 and body["resume"]["count"] == 3
    assert (body["pause"]["p50_ms"], body["pause"]["p99_ms"]) == (pauses[1], pauses[2])
    assert (body["resume"]["p50_ms"], body["resume"]["p99_ms"]) == (resumes[1], resumes[2])
    moved = sum(e["bytes"] for e in events if e["kind"] == "pause")
    assert body["pause"]["bytes"] == moved
    assert body["pause"]["bytes_per_s"] == pytest.approx(moved / (sum(pauses) / 1e3))
    assert body["recomputes"] == 0 and body["restore_failures"] == 0


def test_status_prints_the_dashboards_headline_figures(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
) -> None:
    refused = refused_url()
    daemon = daemon_factory(make_settings(dashboard={"peers": [refused], "peer_timeout_s": 0.3}))
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "s"})
    c.post("/v1/sessions/s/generate", json={"prompt": "status", "max_new_tokens": 30})
    c.post("/v1/sessions/s/pause")
    host = c.get("/v1/host").json()
    latency = c.get("/v1/host/latency", params={"window_s": 900}).json()
    console = Console(record=True, width=160, force_terminal=False, color_system=None)
    assert print_status(daemon.url, console) == 0
    out = console.export_text()
    held = host["reclaimed_bytes"] + host["pool"]["used_bytes"]
    share = 100 * host["reclaimed_bytes"] / held
    assert f"{human_bytes(host['reclaimed_bytes'])} ({share:.1f}% of sessions' KV)" in out
    assert host["oldest_parked_s"] is not None and host["degraded"] is None
    assert "1 sessions, oldest untouched" in out
    pause_row = next(line for line in out.splitlines() if line.strip("│ ").startswith("pause"))
    assert human_ms(latency["pause"]["p50_ms"]) in pause_row
    assert human_ms(latency["pause"]["p99_ms"]) in pause_row
    hosts = [line for line in out.splitlines() if refused.partition("://")[2] in line]
    assert hosts and "down" in hosts[0]
    assert httpx.get(f"{daemon.url}/healthz").status_code == 200
