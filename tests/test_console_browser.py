"""The console (/ui) in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven
by Selenium; no browser download): every page renders without console errors, the overview's
counters move with MQTT, AMQP and HTTP traffic, a message published over MQTT is found by key
on the search page with its trace (stored by MQTT, delivered over AMQP, acked), and resetting a
group's offset from the page makes its messages come again.
Screenshots of every page go to the test's temporary directory, or, with ``UNIMQ_SCREENSHOTS=1``,
to docs/screenshots/ (linked from the README), so a test run leaves the working tree alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.conftest import REPO_ROOT

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
DOC_SHOTS = REPO_ROOT / "docs" / "screenshots"
PAGES = ("overview", "topics", "groups", "clients", "messages", "cluster")

pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and shutil.which(DRIVER)),
                                reason="needs Debian's chromium and chromium-driver (make test installs them)")


@pytest.fixture
def browser() -> Iterator[Any]:
    profile = tempfile.mkdtemp(prefix="unimq-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1280,900"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: docs/screenshots/ with UNIMQ_SCREENSHOTS=1, else the test's tmp dir."""
    return DOC_SHOTS if os.environ.get("UNIMQ_SCREENSHOTS") == "1" else tmp_path


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            v = check()
        except Exception:  # noqa: BLE001  (an element not there yet)
            v = None
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def click(driver: Any, by: str, value: str, what: str) -> None:
    """Click an element of a list the page re-renders on its live refresh (every 2 s): one
    found just before a refresh is stale by the click, so find it again and retry."""

    def attempt() -> bool:
        driver.find_element(by, value).click()
        return True

    wait_for(attempt, what=what)


def errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver: Any, base: str, page: str) -> None:
    driver.get(f"{base}/ui/?refresh=500#{page}")
    wait_for(lambda: driver.find_element(By.ID, "status").text.startswith("live")
             and driver.find_element(By.ID, f"page-{page}").is_displayed(), what=f"the {page} page to load")


def door_total(driver: Any, door: str) -> int:
    """Read in one script call: the live refresh replaces the card every 500 ms, so an element found
    by one WebDriver command can be stale by the next (a CI failure under load)."""
    text = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
        f"#door-{door} .in-total")
    if text is None:
        raise AssertionError(f"no counter for the {door} door")
    return int(text.replace(",", ""))


def test_console_pages_counters_search_and_reset(unimq_server: Any, browser: Any, shots: Path) -> None:
    srv = unimq_server()
    base = srv.url().rstrip("/")
    h = httpx.Client(base_url=base, timeout=20)
    # the meters are traced, and an AMQP queue takes them
    assert h.post("/v1/topics", json={"name": "meters", "attributes": {"trace_enabled": "true"}}).status_code == 201
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", srv.ports["amqp"], client_properties={"connection_name": "meter-reader"}))
    consumer = conn.channel()
    consumer.queue_declare("meter-readings", durable=True)
    consumer.queue_bind("meter-readings", "amq.topic", "meters.42.#")

    # the overview, before and after traffic through three doors
    open_page(browser, base, "overview")
    before = {d: door_total(browser, d) for d in ("mqtt", "amqp", "http")}
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="console-dev", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", srv.ports["mqtt"])
    pub.loop_start()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("keys", "meter-42")
    pub.publish("meters/42/kwh", b'{"kwh": 3.25}', qos=1, properties=props).wait_for_publish(10)
    conn.channel().basic_publish("amq.topic", "meters.43.kwh", b'{"kwh": 1}')
    for i in range(3):
        assert h.post("/v1/topics/invoices/messages", params={"keys": f"inv-{i}"}, content=f"invoice {i}".encode()).is_success
    wait_for(lambda: all(door_total(browser, d) > before[d] for d in before), what="every door's counter to move")
    wait_for(lambda: any(float(t.replace(",", "")) > 0 for t in browser.execute_script(
        "return Array.from(document.querySelectorAll('.in-rate'), e => e.textContent);")),
             what="a rate on the chart")
    assert errors(browser) == []
    shots.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shots / "overview.png"))  # with the traffic on its chart

    # a pop group over HTTP consumes the invoices
    got = h.post("/v1/topics/invoices/groups/accounting/pop", params={"max": 32}).json()["messages"]
    assert len(got) == 3
    h.post("/v1/topics/invoices/groups/accounting/ack", json={"receipt_handles": [m["receipt_handle"] for m in got]})
    assert h.post("/v1/topics/invoices/groups/accounting/pop").json()["messages"] == []

    # every page renders without console errors; a screenshot of each
    for page in PAGES:
        open_page(browser, base, page)
        if page == "topics":
            wait_for(lambda: browser.find_element(By.ID, "topic-invoices"), what="the invoices row")
        if page == "clients":
            wait_for(lambda: browser.find_element(By.ID, "client-mqtt-console-dev"), what="the MQTT client row")
        assert errors(browser) == [], page
        if page != "overview":
            browser.save_screenshot(str(shots / f"{page}.png"))

    # the MQTT message consumed over AMQP (basic_consume, ack): its trace is complete
    got_reading: list[bytes] = []

    def on_reading(ch: Any, method: Any, props: Any, body: bytes) -> None:
        ch.basic_ack(method.delivery_tag)
        got_reading.append(body)

    consumer.basic_consume("meter-readings", on_reading)
    wait_for(lambda: conn.process_data_events(time_limit=0.2) or got_reading, what="the AMQP delivery")
    [found] = h.get("/v1/admin/messages", params={"topic": "meters", "key": "meter-42"}).json()["items"]
    wait_for(lambda: "acked" in [e["event"] for e in h.get(f"/v1/messages/{found['message_id']}/trace").json()["events"]],
             what="the ack in the trace")

    # the MQTT message found by key on the search page, with the door it came in by
    open_page(browser, base, "messages")
    Select(browser.find_element(By.ID, "search-by")).select_by_value("key")
    browser.find_element(By.ID, "search-topic").send_keys("meters")
    browser.find_element(By.ID, "search-value").send_keys("meter-42")
    browser.find_element(By.ID, "search-button").click()
    card = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "#search-results .msg"), what="a search result")
    assert card.find_element(By.CSS_SELECTOR, ".protocol").text == "mqtt"
    assert '"kwh": 3.25' in card.find_element(By.CSS_SELECTOR, "pre.body").text
    [hex_tab] = [b for b in card.find_elements(By.CSS_SELECTOR, ".tabs button") if b.text == "hex"]
    hex_tab.click()
    assert card.find_element(By.CSS_SELECTOR, "pre.body").text.startswith("7b 22 6b 77 68")
    # its trace: stored by MQTT, delivered over AMQP to the queue's consumer, acked
    events = wait_for(lambda: [(e.get_attribute("data-event"), e.get_attribute("data-door"))
                               for e in card.find_elements(By.CSS_SELECTOR, ".trace li.trace-event")],
                      what="the trace timeline")
    assert events == [("stored", "mqtt"), ("delivered", "amqp"), ("acked", "amqp")]
    delivered = card.find_elements(By.CSS_SELECTOR, ".trace li.trace-event")[1].text
    assert "meter-readings" in delivered and "meter-reader" in delivered
    browser.execute_script("arguments[0].scrollIntoView()", card.find_element(By.CSS_SELECTOR, ".trace"))
    browser.save_screenshot(str(shots / "messages.png"))
    assert errors(browser) == []

    # reset the group from its page: the invoices come again over HTTP
    open_page(browser, base, "groups")
    click(browser, By.ID, "group-accounting", "the accounting row")
    wait_for(lambda: browser.find_element(By.ID, "group-detail").is_displayed()
             and Select(browser.find_element(By.ID, "reset-topic")).options, what="the group's detail")
    Select(browser.find_element(By.ID, "reset-mode")).select_by_value("offset")
    browser.find_element(By.ID, "reset-value").send_keys("0")
    browser.find_element(By.ID, "reset-button").click()
    wait_for(lambda: "reset invoices" in browser.find_element(By.ID, "group-result").text, what="the reset's answer")
    browser.save_screenshot(str(shots / "groups.png"))
    again = h.post("/v1/topics/invoices/groups/accounting/pop", params={"max": 32}).json()["messages"]
    assert sorted(m["message_id"] for m in again) == sorted(m["message_id"] for m in got)
    assert errors(browser) == []

    conn.close()
    pub.loop_stop()
    pub.disconnect()
    h.close()
