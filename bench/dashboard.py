"""The dashboard in headless Chromium: first render of a 10,000-point job page, frames while live.

Seeds a job of the real control plane (uvicorn, SQLite; a backend that launches nothing) with
10,000 metric points through the report endpoint, then opens its page in Debian's chromium
(Playwright) and measures:

- time to first render: navigation start -> every chart drawn with every point the page reads
  (the job's series: all the steps up to SERIES_POINTS, beyond that its bounded cut with the
  extremes kept); goal < 1 s, cold (a fresh browser context per run);
- frames while 10 points/s stream in: the dashboard's work per frame (applying the events and
  redrawing the charts: the `dashboard:frame` user-timing measures), goal < 16 ms median; also
  the interval between animation frames (display-bound: 16.7 ms at 60 Hz) and long tasks.

    PYTHONPATH=. .venv/bin/python -m bench.dashboard [--points 10000] [--runs 5] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.api_ingest import ADMIN, TOKEN, start_server

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
CHARTS = ("loss", "speed", "participants")

SERIES_POINTS = 2000
"""The series' bound the job page asks for (web/static/history.js)."""
# Each page starts logged in, as the login URL leaves it: the token in the tab's session storage.
LOGGED_IN = f"sessionStorage.setItem('migrator.token', {json.dumps(TOKEN)});"
# Installed before the page's own scripts: note when each chart first shows `target` points.
WATCH = """
window.__rendered = {};
document.addEventListener('DOMContentLoaded', () => {
  new MutationObserver((changes) => {
    for (const change of changes) {
      const box = change.target;
      const done = Number(box.dataset.points) >= window.__target;
      if (done && !(box.dataset.chart in window.__rendered)) {
        window.__rendered[box.dataset.chart] = performance.now();
      }
    }
  }).observe(document.body, { attributes: true, subtree: true, attributeFilter: ['data-points'] });
});
"""

# Started once the page is live: animation-frame intervals, the dashboard's frame work, long tasks.
FRAMES = """() => {
  window.__frames = { deltas: [], work: [], longTasks: [] };
  let last = performance.now();
  const tick = (now) => {
    window.__frames.deltas.push(now - last);
    last = now;
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) window.__frames.work.push(entry.duration);
  }).observe({ type: 'measure' });
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) window.__frames.longTasks.push(entry.duration);
  }).observe({ type: 'longtask' });
}"""


def metric(step: int, at: float) -> dict[str, Any]:
    participants = 1 if 4000 <= step < 4050 else 2  # a pod down for 50 steps
    return {"kind": "metric", "time": at, "data": {
        "step": step, "epoch": 1 + step * 3 // 10_001, "loss": 0.3 + 0.4 * math.exp(-step / 2000)
        + 0.05 * math.sin(step / 7), "learning_rate": 1e-4, "participants": participants,
        "samples_per_second": 400 + 30 * math.sin(step / 50) - (200 if participants == 1 else 0),
        "samples_seen": step * 32}}


def seed(client: httpx.Client, data_dir: Path, points: int) -> tuple[str, str, str]:
    """A job holding `points` metric points, 10 per second up to now; (job id, pod, token)."""
    response = client.post("/api/v1/jobs", headers=ADMIN, json={"name": "bench", "replicas": 2})
    response.raise_for_status()
    job_id = response.json()["id"]
    token = (data_dir / "bench-tokens" / job_id).read_text()
    pod, start, seq = f"{job_id}-0", time.time() - points / 10, 0
    epoch_ends = {points * epoch // 3: epoch for epoch in (1, 2, 3)}
    for first in range(1, points + 1, 1000):
        records = []
        for step in range(first, min(first + 1000, points + 1)):
            records.append(metric(step, start + step / 10))
            if step in epoch_ends:  # one validation result per epoch
                records.append({"kind": "eval", "time": start + step / 10, "data": {
                    "split": "validation", "epoch": epoch_ends[step], "step": step,
                    "accuracy": 0.7 + 0.05 * epoch_ends[step], "f1": 0.7, "loss": 0.5,
                    "samples": 1000}})
        for record in records:
            seq += 1
            record["seq"] = seq
        report(client, job_id, token, pod, records)
    client.post(f"/api/v1/jobs/{job_id}/pods/1/kill", headers=ADMIN).raise_for_status()
    return job_id, pod, token


def report(client: httpx.Client, job_id: str, token: str, pod: str,
           records: list[dict[str, Any]], incarnation: str = "seed") -> None:
    response = client.post(f"/api/v1/jobs/{job_id}/reports",
                           headers={"Authorization": f"Bearer {token}"},
                           json={"pod": pod, "incarnation": incarnation, "records": records})
    response.raise_for_status()


def drawn(client: httpx.Client, job_id: str) -> int:
    """The points of the job's series the page reads (web/static/history.js asks for
    SERIES_POINTS)."""
    response = client.get(f"/api/v1/jobs/{job_id}/series", headers=ADMIN,
                          params={"points": SERIES_POINTS})
    response.raise_for_status()
    return len(response.json()["points"])


def first_render(browser: Any, url: str, points: int) -> float:
    """Seconds from navigation start until every time/step chart holds `points` (cold)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.extend([m.text] if m.type == "error" else []))
    page.add_init_script(f"{LOGGED_IN}\nwindow.__target = {points};\n{WATCH}")
    page.goto(url)
    deadline = time.monotonic() + 60
    while len(rendered := page.evaluate("() => window.__rendered")) < len(CHARTS):
        if time.monotonic() > deadline:
            raise SystemExit(f"the charts never showed {points} points: {rendered} {errors}")
        time.sleep(0.02)
    if errors:
        raise SystemExit(f"console errors: {errors}")
    context.close()
    return max(rendered.values()) / 1000


def stream(client: httpx.Client, job_id: str, pod: str, token: str, first_step: int,
           seconds: float, stop: threading.Event) -> int:
    """Report one point every 100 ms (10 points/s) for `seconds`; the number sent."""
    due, sent = time.monotonic(), 0
    while sent < seconds * 10 and not stop.is_set():
        step = first_step + sent
        report(client, job_id, token, pod, [{"seq": sent + 1, **metric(step, time.time())}],
               "live")
        sent += 1
        due += 0.1
        time.sleep(max(0.0, due - time.monotonic()))
    return sent


def live_frames(browser: Any, client: httpx.Client, url: str, seeded: tuple[str, str, str],
                steps: int, points: int, seconds: float) -> dict[str, list[float]]:
    """Frames while points stream in after the `steps` seeded ones; the page drew `points`."""
    job_id, pod, token = seeded
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.add_init_script(f"{LOGGED_IN}\nwindow.__target = {points};\n{WATCH}")
    page.goto(url)
    while len(page.evaluate("() => window.__rendered")) < len(CHARTS):
        time.sleep(0.05)
    page.evaluate(FRAMES)
    stop = threading.Event()
    sent = stream(client, job_id, pod, token, steps + 1, seconds, stop)
    deadline, expected = time.monotonic() + 10, points + sent
    while (shown := int(page.evaluate(
            "() => document.querySelector('[data-chart=loss]').dataset.points"))) != expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"the loss chart shows {shown} points, expected {expected}")
        time.sleep(0.05)
    frames: dict[str, list[float]] = page.evaluate("() => window.__frames")
    context.close()
    frames["sent"] = [float(sent)]
    return frames


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(Path(scratch))
        try:
            with httpx.Client(base_url=url, timeout=60) as client, \
                    sync_playwright() as playwright:
                seeded = seed(client, Path(scratch), args.points)
                page_url = f"{url}/#/jobs/{seeded[0]}"
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                points = drawn(client, seeded[0])
                renders = [first_render(browser, page_url, points) for _ in range(args.runs)]
                frames = live_frames(browser, client, page_url, seeded, args.points, points,
                                     args.seconds)
                version = browser.version
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    work, deltas = sorted(frames["work"]), sorted(frames["deltas"])
    p95 = statistics.quantiles(work, n=20)[18]
    render = statistics.median(renders)
    frame = statistics.median(work)
    print(f"Chromium {version}, {args.points:,} metric points ({points:,} in the series the "
          f"page draws), {args.runs} cold loads; {int(frames['sent'][0])} points streamed at "
          "10/s")
    print("| figure | measured | goal | ratio to goal |")
    print("|---|---|---|---|")
    print(f"| time to first render, job page with {args.points:,} points (median of "
          f"{args.runs}; min {min(renders):.3f} s, max {max(renders):.3f} s) | {render:.3f} s "
          f"| < 1 s | {render:.2f} |")
    print(f"| frame work while 10 points/s stream in (median of {len(work)} frames; p95 "
          f"{p95:.1f} ms, max {work[-1]:.1f} ms) | {frame:.1f} ms | < 16 ms | "
          f"{frame / 16:.2f} |")
    print(f"| animation-frame interval meanwhile (median of {len(deltas)}; p99 "
          f"{statistics.quantiles(deltas, n=100)[98]:.1f} ms; frames over 25 ms: "
          f"{sum(d > 25 for d in deltas)}; long tasks: {len(frames['longTasks'])}) | "
          f"{statistics.median(deltas):.1f} ms | display-bound (16.7 ms at 60 Hz) | - |")
    print(json.dumps({"first_render_s": renders, "frame_work_ms_median": frame}))


if __name__ == "__main__":
    main()
