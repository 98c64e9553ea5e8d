"""Step B: the browser preset (issue 15's targets).

* B1: cold start to the first screenshot of a local page: ``Sandbox(preset="browser")``,
  the page written into the workspace, ``sandbox.browser().goto(file)`` and
  ``screenshot()`` (the PNG back on the host).  Target: p50 <= 3 s on runc.
  Floor: the engine runs the same image on the same runtime with Chromium's own
  one-shot ``--screenshot`` of the same page (no Playwright, no sandbox policy), until
  the container has exited.
* B2: a second screenshot in a warm browser sandbox.  Target: p50 <= 300 ms.
  Floor: Playwright's ``page.screenshot()`` timed inside the same sandbox (what
  Chromium and Playwright cost; ours adds the call into the session and the PNG's trip).

The image is built (or found) before anything is timed.  Imported by bench.py.
"""

from __future__ import annotations

import functools
import json
import time

from harness import FLOOR_LABELS, Floor, Plan, Reaper, Result, Series, Target, remove_quietly, timed

from agentnest import Sandbox
from agentnest.browser import browser_image
from agentnest.browser.driver import png_size

PAGE = "<!doctype html><title>bench</title><h1>AgentNest</h1><p>" + "text " * 200 + "</p>"
FLOOR_SCRIPT = (
    "printf '%s' \"$PAGE\" > /tmp/page.html && "
    "/usr/lib/chromium/chromium-headless-shell --no-sandbox --disable-gpu --window-size=1280,720 "
    "--screenshot=/tmp/shot.png file:///tmp/page.html >/dev/null 2>&1 && test -s /tmp/shot.png"
)
INSIDE = """
import json, time
from playwright.sync_api import sync_playwright
_p = sync_playwright().start()
_b = _p.chromium.launch(executable_path="/usr/lib/chromium/chromium-headless-shell")
_pg = _b.new_page(viewport={"width": 1280, "height": 720})
_pg.set_content(%r)
_pg.screenshot()
_times = []
for _ in range(%d):
    _t = time.perf_counter(); _pg.screenshot(); _times.append(time.perf_counter() - _t)
_b.close(); _p.stop()
print(json.dumps(_times))
"""


def bench_browser(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    """B1, B2."""
    image = browser_image()
    cold = Series("Sandbox(preset='browser') + goto(file) + screenshot()", "ms")
    cold_floor = Series("docker run + chromium --screenshot", "ms")
    warm = Series("browser.screenshot() again", "ms")
    warm_floor = Series("page.screenshot() inside the sandbox", "ms")
    n = max(plan.cold // 2, 5)
    with Reaper() as reaper:
        for i in range(n + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            sandbox = Sandbox(preset="browser", backend=backend, timeout=600)
            reaper.add(sandbox.destroy)
            sandbox.write_file("page.html", PAGE)
            browser = sandbox.browser()
            browser.goto("/workspace/page.html")
            shot = browser.screenshot()
            took = time.perf_counter() - t0
            if png_size(shot.png) != (1280, 720):
                raise RuntimeError("the screenshot has the wrong size")
            if i:
                cold.samples.append(took)
            if i == n:
                for _ in range(plan.warm // 10 + 20):
                    warm.samples.append(timed(browser.screenshot))
                inside = sandbox.python_session(name="floor").run(
                    INSIDE % (PAGE, len(warm.samples)), timeout=300
                )
                warm_floor.samples.extend(float(t) for t in json.loads(inside.check().stdout))
            sandbox.destroy()
        for i in range(n + 1):
            t0 = time.perf_counter()
            container = floor.client.containers.run(
                image,
                ["sh", "-c", FLOOR_SCRIPT],
                detach=True,
                runtime=floor.runtime,
                network_mode="none",
                labels=FLOOR_LABELS,
                user="65532:65532",
                environment={"PAGE": PAGE},
                # Under this gVisor, Docker's default seccomp profile answers
                # clone3 with EPERM (not ENOSYS), so no thread can start;
                # AgentNest's own profile leaves clone3 to gVisor.
                security_opt=["seccomp=unconfined"] if floor.runtime.startswith("runsc") else None,
            )
            reaper.add(functools.partial(remove_quietly, container))
            status = container.wait(timeout=120)
            took = time.perf_counter() - t0
            if status.get("StatusCode") != 0:
                raise RuntimeError(f"the floor's chromium failed: {container.logs()[-500:]!r}")
            if i:
                cold_floor.samples.append(took)
            remove_quietly(container)
    notes = [
        f"image {image} (Debian's Chromium, Playwright); each B1 sample a fresh sandbox; "
        "the floor has no Playwright, no policy and no page driver",
    ]
    return [
        Result(
            backend,
            "B1",
            "browser: cold start to first screenshot",
            cold,
            cold_floor,
            Target("p50_le", 3000.0),
            notes=notes,
        ),
        Result(backend, "B2", "browser: second screenshot, warm", warm, warm_floor, Target("p50_le", 300.0)),
    ]
