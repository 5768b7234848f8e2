"""The checkpoints page in a real browser: headless Chromium (Debian's, driven by
Playwright) logs into Airflow's UI, opens the plugin's entry in the navigation and the
pipeline's page, and the history table shows exactly the checkpoints and savepoints that
`sparkpoint list --json` reports; the trend charts (inline SVG) show one point per
completed checkpoint, styled by the page's hashed style sheet with no CSP violation. Screenshots are saved as
test artifacts (``$SPARKPOINT_UI_ARTIFACTS`` or ``<tmp>/ui-artifacts``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.ui_stack import SECRETS, USERS, Stack

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.s3, pytest.mark.timeout(1200)]

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture()
def artifacts(tmp_path: Path) -> Path:
    path = Path(os.environ.get("SPARKPOINT_UI_ARTIFACTS") or tmp_path / "ui-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_the_page_shows_exactly_the_checkpoints_the_cli_lists(ui_stack: Stack, artifacts: Path) -> None:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium "
                    "(apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    cli = ui_stack.cli_json("list", "--dir", str(ui_stack.root), "--job", "ui_totals")
    expected = [(e["kind"], str(e["id"]), e["status"], str(e["batch_id"])) for e in [*cli["checkpoints"],  # type: ignore[misc]
                                                                                     *cli["savepoints"]]]
    assert len(expected) == 4
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            # Airflow's own login form (SimpleAuthManager), as a person signs in.
            page.goto(f"{ui_stack.url}/auth/login/", wait_until="networkidle")
            page.fill("input[name='username']", "viewer")
            page.fill("input[name='password']", USERS["viewer"])
            page.click("button[type='submit']")
            page.wait_for_url(lambda url: "/auth/login" not in url, timeout=120_000)

            # The plugin's entry in Airflow's navigation: the pipeline list in an iframe.
            page.goto(f"{ui_stack.url}/plugin/sparkpoint", wait_until="networkidle")
            frame = page.frame_locator("iframe")
            frame.locator("#pipelines").wait_for(timeout=120_000)
            assert frame.locator("#pipelines a").all_inner_texts() == ["ui_totals"]
            page.screenshot(path=str(artifacts / "airflow-nav-pipelines.png"))
            frame.locator("#pipelines a", has_text="ui_totals").click()
            frame.locator("#history").wait_for(timeout=120_000)
            page.screenshot(path=str(artifacts / "airflow-checkpoints-in-ui.png"), full_page=True)

            # The page itself (the operators' extra link target).
            console.clear()  # only the plugin's page: Airflow's own pages are not under test here
            page.goto(f"{ui_stack.url}/sparkpoint/pipelines/sp_local/ui_totals", wait_until="networkidle")
            rows = page.locator("#history tr.snapshot")
            shown = [(rows.nth(i).get_attribute("data-kind"), rows.nth(i).get_attribute("data-id"),
                      rows.nth(i).get_attribute("data-status"), rows.nth(i).locator("td").nth(3).inner_text())
                     for i in range(rows.count())]
            assert shown == expected
            assert page.locator("#count-completed").inner_text() == "4"
            assert page.locator("#generations tr").count() == 3  # header + 2 generations
            assert "chk-2" in page.locator("#generations").inner_text()  # what generation 2 restored
            html = page.content()
            assert not any(secret in html for secret in SECRETS)
            page.screenshot(path=str(artifacts / "checkpoints-page.png"), full_page=True)

            # The trends: one point per completed checkpoint (4), drawn with the page's style.
            charts = page.locator("svg.trend")
            assert charts.count() == 3
            for i in range(3):
                chart = charts.nth(i)
                assert chart.get_attribute("data-points") == "4"
                assert chart.locator("circle.dot").count() == 4
                line = chart.locator("polyline.line")
                box = line.bounding_box()
                assert box is not None and box["width"] > 100, box
                assert line.evaluate("e => getComputedStyle(e).stroke") == "rgb(37, 99, 235)"
            page.locator("#trends").screenshot(path=str(artifacts / "checkpoint-trends.png"))
            violations = [m for m in console if "Content Security Policy" in m or "Refused" in m]
            assert violations == [], violations

            # A pipeline used by a DAG the viewer may not read: as if it did not exist.
            denied = page.goto(f"{ui_stack.url}/sparkpoint/pipelines/sp_local/hidden")
            assert denied is not None and denied.status == 404
        finally:
            browser.close()
    for name in ("airflow-nav-pipelines.png", "airflow-checkpoints-in-ui.png", "checkpoints-page.png",
                 "checkpoint-trends.png"):
        assert (artifacts / name).stat().st_size > 10_000, name
