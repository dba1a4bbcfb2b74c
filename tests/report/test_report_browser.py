"""The report of real runs in a real headless Chromium: it loads clean, fetches nothing, filters, runs no injection.

Needs selenium (the test extra) and Debian's ``chromium`` + ``chromium-driver``; skipped with the reason otherwise.
No timing is asserted: waits are generous, a loaded machine is slow, not wrong.
"""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
from report_helpers import copy_run, jsonl, poison

from lrmgym.report import write_report

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

WAIT_S = 120
_BROWSER = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
_DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    _BROWSER is None or _DRIVER is None,
    reason="needs Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def driver():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _BROWSER
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1800")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(_DRIVER))
    browser.set_page_load_timeout(WAIT_S)
    yield browser
    browser.quit()


def _open(driver, run_dir, out) -> list[dict]:
    """Write the report of ``run_dir`` to ``out``, load it, wait for its table; returns the console's entries."""
    write_report(run_dir, out)
    driver.get(out.as_uri())
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    return driver.get_log("browser")


def _rows(driver) -> int:
    return len(driver.find_elements(By.CSS_SELECTOR, "#samples-body tr.sample"))


def _until_rows(driver, n: int) -> None:
    WebDriverWait(driver, WAIT_S).until(lambda d: _rows(d) == n, message=f"expected {n} visible rows")


def _type(driver, element_id: str, text: str) -> None:
    box = driver.find_element(By.ID, element_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    if text:
        box.send_keys(text)


def _trajectories(records: list[dict]) -> int:
    return sum(len(r["trajectories"]) for r in records)


def _verdict(v: dict | None) -> str:
    if v is None:
        return "unjudged"
    return "ungradeable" if v["score"] is None else "correct" if v["correct"] else "incorrect"


def test_the_report_loads_clean_fetches_nothing_and_its_filters_count_right(make_run, driver, tmp_path):
    run_dir = make_run("grpo")
    records = jsonl(run_dir / "samples.jsonl")
    log = _open(driver, run_dir, tmp_path / "report.html")
    assert [e for e in log if e["level"] == "SEVERE"] == [], log
    assert driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)") == []
    total = _trajectories(records)
    _until_rows(driver, min(total, 100))
    assert driver.find_element(By.ID, "samples-count").text == f"{total} of {total} trajectories match"

    task = records[1]["task_id"]  # the text box: a task id matches its groups' trajectories, at every step
    _type(driver, "filter-text", task)
    _until_rows(driver, _trajectories([r for r in records if r["task_id"] == task]))
    _type(driver, "filter-text", "")
    _until_rows(driver, total)

    verdicts = Counter(_verdict(t["verdict"]) for r in records for t in r["trajectories"])
    rare = min(verdicts, key=verdicts.get)  # the verdict filter
    Select(driver.find_element(By.ID, "filter-verdict")).select_by_value(rare)
    _until_rows(driver, verdicts[rare])
    Select(driver.find_element(By.ID, "filter-verdict")).select_by_value("")
    _until_rows(driver, total)

    _type(driver, "filter-step-min", "2")  # the step range
    _type(driver, "filter-step-max", "2")
    _until_rows(driver, _trajectories([r for r in records if r["step"] == 2]))
    shot = tmp_path / "report.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_staged_runs_stage_filter(make_run, driver, tmp_path):
    run_dir = make_run("ring_zero")
    log = _open(driver, run_dir, tmp_path / "staged.html")
    assert [e for e in log if e["level"] == "SEVERE"] == [], log
    rl1 = _trajectories(jsonl(run_dir / "stages/01-rl1/samples.jsonl"))
    rl2 = _trajectories(jsonl(run_dir / "stages/03-rl2/samples.jsonl"))
    _until_rows(driver, min(rl1 + rl2, 100))
    Select(driver.find_element(By.ID, "filter-stage")).select_by_visible_text("03-rl2")
    _until_rows(driver, rl2)


def test_injected_markup_runs_nothing_and_shows_as_text(make_run, driver, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "evil")
    poison(run_dir)
    log = _open(driver, run_dir, tmp_path / "evil.html")
    assert [e for e in log if e["level"] == "SEVERE"] == [], log  # a CSP refusal would be one
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - reading it is the check
    assert driver.title == "lrmgym report: evil"  # the onerror handler never ran
    assert driver.execute_script("return document.querySelectorAll('img, iframe').length") == 0
    _type(driver, "filter-text", "xss-marker")
    _until_rows(driver, 1)
    cell = driver.find_element(By.CSS_SELECTOR, "#samples-body tr.sample td:nth-child(3)")
    assert "xss-marker </script><script>alert(1)</script><img src=x onerror=" in cell.text
