"""GET /dashboard: a static page anyone may load, and its JSON, which names every tenant's
adapters, for the operator only. A real headless Chromium (when installed) renders it with
data after a few requests, with no console errors, and saves a screenshot."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
from gateway_testlib import ADAPTER_NAMES
from tenancy_testlib import ADMIN_KEY, Api

ARTIFACTS = Path(os.environ.get("LORAGATE_TEST_ARTIFACTS", "test-artifacts"))


@pytest.fixture(scope="module")
def tenanted(start_server):
    return start_server(gateway={"admin_key": ADMIN_KEY})


def test_the_page_needs_no_key_and_loads_nothing_from_elsewhere(tenanted):
    got = httpx.get(f"{tenanted.url}/dashboard", timeout=30)
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/html")
    assert "<canvas" in got.text and "dashboard/data" in got.text
    assert "http://" not in got.text and "https://" not in got.text  # works offline


def test_the_data_is_the_operators_alone(tenanted):
    admin = Api(tenanted.url, ADMIN_KEY)
    tenant = admin.as_key(admin.create_tenant("dash-tenant"))
    assert httpx.get(f"{tenanted.url}/dashboard/data", timeout=30).status_code == 401
    assert tenant.get("/dashboard/data").status_code == 403
    base = admin.base_model()
    assert tenant.complete(base, max_tokens=3).status_code == 200
    assert admin.complete(ADAPTER_NAMES[0], max_tokens=4).status_code == 200
    data = admin.get("/dashboard/data").json()
    assert data["model"] == base
    assert data["generation_tokens"] == 7
    tenants = {t["name"]: t for t in data["tenants"]}
    assert tenants["dash-tenant"]["requests"] == 1 and tenants["default"]["requests"] == 1
    adapters = {a["name"]: a for a in data["adapters"]}
    assert adapters[ADAPTER_NAMES[0]]["requests"] == 1
    assert adapters[ADAPTER_NAMES[0]]["tier"] in ("device", "cpu")
    assert {a["tier"] for a in data["adapters"] if a["name"] in ADAPTER_NAMES[1:]} <= {
        "device", "cpu", "disk",
    }  # fmt: skip
    assert data["ttft_p50"] is not None


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="needs chromium (apt-get install chromium)")
def test_a_real_browser_renders_the_dashboard_with_data(start_server):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url = start_server().url
    for name in (*ADAPTER_NAMES[:2], None):
        model = name or httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "Hello", "max_tokens": 5, "temperature": 0}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    options = webdriver.ChromeOptions()
    options.binary_location = _chromium()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(f"{url}/dashboard")

        def rows(d):
            found = d.find_elements(By.CSS_SELECTOR, "#adapters tbody tr")
            return found if len(found) >= len(ADAPTER_NAMES) else False

        WebDriverWait(driver, 60).until(rows)
        WebDriverWait(driver, 60).until(lambda d: d.find_element(By.ID, "model").text != "…")
        # more traffic while the page polls: the throughput line rises above zero
        body = {"model": ADAPTER_NAMES[2], "prompt": "Hi", "max_tokens": 8, "temperature": 0}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return Math.max(...series.throughput[0])") > 0
        )
        text = driver.find_element(By.ID, "adapters").text
        assert ADAPTER_NAMES[0] in text and "__base__" in text
        drawn = driver.execute_script(
            "const c = document.getElementById('queue');"
            "const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i]) n++; return n;"
        )
        assert drawn > 0  # the axes and lines are on the canvas
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()
