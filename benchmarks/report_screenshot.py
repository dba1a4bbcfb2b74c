"""A screenshot of `lrmgym report` of a real run, taken in headless Chromium: benchmarks/results/report_screenshot.png.

    python benchmarks/report_screenshot.py                      # trains a small GRPO run first (about two minutes)
    python benchmarks/report_screenshot.py --run runs/my-run    # or shows an existing run (its page goes to a temp dir)

benchmarks/results/report_screenshot_ppo.png is `--run` of a PPO run (learner=ppo, 30 steps, the same sizes), for the
critic's charts.

Needs selenium and Debian's chromium + chromium-driver. The page is also checked the way a reader would see it:
the console must be free of errors and nothing may be fetched.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
RUN = (
    "run", "env=math", "policy=tiny", "learner=grpo", "judge=[accuracy,format_strict]",
    "learner.prompts_per_step=8", "learner.group_size=8", "learner.progress=false", "learner.eval_every=10",
    "eval.tasks=100", "eval.n=2",
)  # fmt: skip


def _train(root: Path, steps: int) -> Path:
    from lrmgym.cli.main import cli

    args = [*RUN, f"learner.steps={steps}", f"run.output_dir={root}", "run.name=grpo"]
    print("lrmgym", " ".join(args), flush=True)
    cli.main(args, prog_name="lrmgym", standalone_mode=False)
    return root / "grpo"


def _screenshot(page: Path, png: Path, width: int, max_height: int) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver_path = shutil.which("chromedriver")
    if browser is None or driver_path is None:
        sys.exit("needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},900",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        driver.get(page.as_uri())
        WebDriverWait(driver, 120).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        if errors or fetched:
            sys.exit(f"the page is not clean: console errors {errors}, fetched {fetched}")
        height = min(int(driver.execute_script("return document.body.scrollHeight")), max_height)
        driver.set_window_size(width, height)
        time.sleep(1)  # the resize's relayout
        png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(png))
    finally:
        driver.quit()


def main() -> None:
    """Train (or take) a run, write its report, screenshot it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="an existing run directory (default: train a small GRPO run)")
    parser.add_argument("--steps", type=int, default=40, help="steps of the run trained when --run is not given")
    parser.add_argument("--out", type=Path, default=RESULTS / "report_screenshot.png", help="the screenshot")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--max-height", type=int, default=3600, help="the page is cut there (the samples go on)")
    args = parser.parse_args()

    from lrmgym.report import write_report

    with tempfile.TemporaryDirectory(prefix="lrmgym-report-") as tmp:
        run_dir = args.run or _train(Path(tmp), args.steps)
        page, report = write_report(run_dir, Path(tmp) / "report.html")
        print(f"report of {run_dir}: {len(report.html) / 1e6:.2f} MB, {len(report.samples.rows)} trajectories")
        _screenshot(page, args.out, args.width, args.max_height)
    print(f"screenshot: {args.out}")


if __name__ == "__main__":
    main()
