"""The console's first render in Debian's headless chromium (Selenium): signs in at
`URL?token=` (the token from KERNELBOX_CONSOLE_TOKEN, never an argument), loads the page again
with its cookie, and prints one JSON object: `first_render_ms` (navigation start to the page's
first complete render, its `data-rendered` mark), `bytes` (the page, its assets and its API
answers, as transferred), `rows` (kernel rows shown) and `count` (the kernel count shown).
Run by tests/console.rs against a server with 1,000 kernels."""

from __future__ import annotations

import json
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def main() -> None:
    url = sys.argv[1]
    token = os.environ["KERNELBOX_CONSOLE_TOKEN"]
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("KERNELBOX_CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,800"):  # fmt: skip
        options.add_argument(arg)
    driver_path = os.environ.get("KERNELBOX_CHROMEDRIVER", "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        rendered = lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-rendered")  # noqa: E731
        driver.get(f"{url}?token={token}")
        WebDriverWait(driver, 30).until(rendered)
        # Measured: a load of the page as an operator opens it, the browser warm.
        driver.get(url)
        mark = float(WebDriverWait(driver, 30).until(rendered))
        weight = driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return performance.getEntriesByType('resource')"
            ".reduce((s, r) => s + r.encodedBodySize, n.encodedBodySize);")  # fmt: skip
        rows = len(driver.find_elements(By.CSS_SELECTOR, "#kernels tbody tr"))
        count = driver.find_element(By.ID, "kernel-count").text
        print(json.dumps({"first_render_ms": mark, "bytes": weight, "rows": rows, "count": count}))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
