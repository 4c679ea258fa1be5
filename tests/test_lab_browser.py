"""`course lab` in a real browser: Debian's chromium, headless, driven through /usr/bin/chromedriver.

Two `course lab` servers run as the CLI starts them: one on the reference solutions, one on a student
folder with a wrong slot_mapping (ch25) and an embedding_lookup that hangs on more than 3 ids (ch15).
The browser opens each through the URL it printed (the session's token buys a cookie for that port),
then drives both at their bare URLs, side by side.
Screenshots of every experiment go to $COURSE_LAB_SCREENSHOTS when set. The median time from a
control change to the new figure is printed (run with -s to see it).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import tempfile
from pathlib import Path

import pytest
from conftest import require_chromium, require_sandbox

from grader.lab import catalog
from tests.mutate import mutant
from tests.test_lab import HANG, WRONG_SLOTS, start_lab, stop_lab

pytestmark = pytest.mark.slow
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT = 15


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    require_chromium()  # no server is worth starting without a browser to drive it
    require_sandbox()  # the lab runs a submission in the sandbox, or refuses
    folder = tmp_path_factory.mktemp("student")
    mutant(folder, "ch15", HANG)
    mutant(folder, "ch25", WRONG_SLOTS)
    good = start_lab("--solutions", "--time-limit", "5")
    bad = start_lab("--submission", str(folder), "--time-limit", "1")
    yield {"good": good[1], "bad": bad[1]}  # the URLs they printed, with their tokens
    stop_lab(good[0])
    stop_lab(bad[0])


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = require_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="course-lab-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1440,1800",
        "--lang=zh-CN",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def token_of(printed: str) -> str:
    return printed.split("?token=", 1)[1]


def bare(printed: str) -> str:
    """The lab's URL without its token: where the printed one redirects."""
    return printed.split("?", 1)[0]


def open_printed(driver, printed: str) -> None:
    """Open the URL a lab printed, as its owner does: the token buys the cookie and leaves the address bar."""
    driver.get("about:blank")
    driver.get(printed)
    WebDriverWait(driver, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, "nav button"))
    assert driver.current_url == bare(printed), driver.current_url


@pytest.fixture(scope="module")
def labs(browser, servers):
    """Both labs opened through their printed URLs: their bare URLs, which this browser may now use."""
    for printed in servers.values():
        open_printed(browser, printed)
    return {name: bare(printed) for name, printed in servers.items()}


def test_the_lab_opens_through_the_printed_url_only(browser, servers):
    open_printed(browser, servers["good"])
    seq = open_experiment(browser, bare(servers["good"]), "ch25-paged-kv")
    browser.delete_all_cookies()  # as if the lab had been started again at this port: the page's cookie is no more
    type_into(browser, "T", "4")
    wait_for_result(browser, seq)
    assert state(browser) == "refused" and "printed in the terminal" in browser.find_element(By.ID, "message").text
    for printed in servers.values():
        browser.get(bare(printed))
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "open the URL that course lab printed in the terminal" in body
        assert not any(token_of(p) in browser.page_source for p in servers.values())
        assert not browser.find_elements(By.CSS_SELECTOR, "nav button")
    for printed in servers.values():
        open_printed(browser, printed)
        assert browser.execute_script("return document.cookie") == ""  # HttpOnly: the page's script never sees it
        assert not any(token_of(p) in browser.page_source for p in servers.values())
    cookies = {c["name"]: c for c in browser.get_cookies()}
    ports = sorted(printed.split(":")[2].split("/")[0] for printed in servers.values())
    assert sorted(cookies) == [f"course-lab-{port}" for port in ports], cookies  # one per lab: they do not clash
    for c in cookies.values():
        assert c["httpOnly"] and c["sameSite"] == "Strict" and c["path"] == "/" and c["domain"] == "127.0.0.1", c
    for url in (bare(printed) for printed in servers.values()):  # each lab, with both cookies sent, takes its own
        open_experiment(browser, url, "ch25-paged-kv")
        assert state(browser) in ("passed", "failed")


def open_experiment(driver, url: str, experiment: str) -> str:
    driver.get("about:blank")  # a fresh page: a new hash alone would not load it again
    driver.get(f"{url}#{experiment}")
    return wait_for_result(driver, None)


def wait_for_result(driver, after: str | None) -> str:
    """Wait until the page shows a result newer than `after` (a data-seq); return its seq."""

    def done(d):
        fig = d.find_element(By.ID, "figures")
        seq = fig.get_attribute("data-seq")
        return seq if seq and seq != after and d.find_element(By.ID, "status").get_attribute("data-state") != "running" else False

    return WebDriverWait(driver, WAIT).until(done)


def type_into(driver, name: str, text: str) -> None:
    box = driver.find_element(By.NAME, name)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(text)


def svg_values(driver, figure: str) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, f'[data-figure="{figure}"] svg text.value')]


def state(driver) -> str:
    return driver.find_element(By.ID, "status").get_attribute("data-state")


def test_a_changed_control_redraws_the_figure_from_the_new_instance(browser, labs):
    seq = open_experiment(browser, labs["good"], "ch15-embedding")
    assert state(browser) == "passed"
    assert {"31", "32", "33", "34"} <= set(svg_values(browser, "ch15-dim-embedding"))
    type_into(browser, "ids", "5, 1")
    seq = wait_for_result(browser, seq)
    assert state(browser) == "passed"
    svg = browser.find_element(By.CSS_SELECTOR, '[data-figure="ch15-dim-embedding"] svg')
    assert "ids = [5, 1]" in svg.get_attribute("innerHTML")
    got = svg_values(browser, "ch15-dim-embedding")
    assert {"61", "62", "63", "64", "21", "22", "23", "24"} <= set(got)
    type_into(browser, "H", "2")
    wait_for_result(browser, seq)
    assert "X[1, 2, 2]" in browser.find_element(By.ID, "figures").get_attribute("innerHTML")


def test_a_bound_is_explained_beside_its_control_and_the_figure_stays(browser, labs):
    seq = open_experiment(browser, labs["good"], "ch25-paged-kv")
    type_into(browser, "T", "60")
    wait_for_result(browser, seq)
    assert state(browser) == "invalid"
    assert "between 1 and 10" in browser.find_element(By.ID, "error-T").text
    assert browser.find_elements(By.CSS_SELECTOR, '[data-figure="ch25-dim-slot-mapping"] svg')


def test_slots_follow_the_block_table_and_the_median_latency(browser, labs):
    seq = open_experiment(browser, labs["good"], "ch25-paged-kv")
    browser.execute_script("window.labLatencies = []")
    for n, table in enumerate(["1, 2, 0", "4, 3, 2", "0, 1, 2", "2, 4, 1", "3, 0, 4"] * 2):
        type_into(browser, "block_table", table)
        seq = wait_for_result(browser, seq)
        assert state(browser) == "passed"
        blocks = [int(b) for b in table.split(", ")]
        want = [str(blocks[p // 2] * 2 + p % 2) for p in range(5)]
        slots = [e.text for e in browser.find_elements(By.CSS_SELECTOR, '[data-figure="ch25-dim-slot-mapping"] svg text.value')]
        assert " ".join(want) in " ".join(slots), (table, slots)
    latencies = browser.execute_script("return window.labLatencies")
    median = statistics.median(latencies)
    print(
        f"\ncourse lab: control change → new figure, median {median:.0f} ms over {len(latencies)} changes "
        f"(min {min(latencies):.0f}, max {max(latencies):.0f}; includes the page's {120} ms debounce)"
    )
    assert median < 2000


def test_a_wrong_function_shows_the_message_and_the_marked_cells(browser, labs):
    open_experiment(browser, labs["bad"], "ch25-paged-kv")
    assert state(browser) == "failed"
    message = browser.find_element(By.ID, "message").text
    assert "yours: 0" in message and "hint: the slot uses the physical block from the table" in message
    wrong = browser.find_elements(By.CSS_SELECTOR, '[data-figure="ch25-dim-slot-mapping"] svg rect.wrong')
    assert len(wrong) >= 3
    shoot(browser, "wrong-ch25-paged-kv")


def test_a_hanging_function_times_out_and_the_page_stays_usable(browser, labs):
    seq = open_experiment(browser, labs["bad"], "ch15-embedding")
    assert state(browser) == "passed"
    type_into(browser, "ids", "1, 2, 3, 4")
    seq = wait_for_result(browser, seq)
    assert state(browser) == "timeout"
    assert "did not finish within 1 s" in browser.find_element(By.ID, "message").text
    shoot(browser, "timeout-ch15-embedding")
    type_into(browser, "ids", "1, 2, 3, 0")  # hangs again …
    type_into(browser, "ids", "4, 2")  # … and is replaced before its time limit
    seq = wait_for_result(browser, seq)
    assert state(browser) == "passed" and {"51", "52", "31", "32"} <= set(svg_values(browser, "ch15-dim-embedding"))
    browser.find_element(By.CSS_SELECTOR, 'nav button[data-experiment="ch25-paged-kv"]').click()
    wait_for_result(browser, None)
    assert state(browser) == "failed"


def test_the_engine_panel_shows_the_text_and_the_course_map_after_a_click(browser, labs):
    browser.get("about:blank")
    browser.get(f"{labs['good']}#engine")
    WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.ID, "engine").is_displayed())
    assert not browser.find_element(By.ID, "experiment").is_displayed()
    assert browser.find_element(By.ID, "engine-command").text == "course engine run --prompt 'The KV cache' --max-tokens 32"
    box = browser.find_element(By.ID, "engine-prompt")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("A block table")
    browser.find_element(By.ID, "engine-run").click()
    browser.find_element(By.ID, "engine-run").click()  # a second click replaces the first run (on the server too)
    status = browser.find_element(By.ID, "engine-status")
    WebDriverWait(browser, 120).until(lambda d: status.get_attribute("data-state") not in ("idle", "running"))
    assert status.get_attribute("data-state") == "passed", browser.find_element(By.ID, "engine-message").text
    assert browser.find_element(By.ID, "engine-prompt-shown").text == "A block table"
    assert browser.find_element(By.ID, "engine-completion").text.strip()
    assert browser.find_element(By.ID, "engine-command").text == "course engine run --prompt 'A block table' --max-tokens 32"
    assert re.search(r"steps .* chapters called: \d+ of 18", browser.find_element(By.ID, "engine-numbers").text)
    img = browser.find_element(By.CSS_SELECTOR, "#engine-figure img")
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img))
    assert browser.execute_script("return arguments[0].naturalWidth", img) > 400  # the course map, drawn
    shoot(browser, "engine")


@pytest.mark.parametrize("experiment", sorted(catalog().experiments))
def test_screenshot_of_every_experiment(browser, labs, experiment):
    open_experiment(browser, labs["good"], experiment)
    assert state(browser) == "passed", browser.find_element(By.ID, "message").text
    figures = browser.find_elements(By.CSS_SELECTOR, "#figures svg")
    assert len(figures) == len(catalog().find(experiment).figures)
    shoot(browser, experiment)


def shoot(driver, name: str) -> None:
    folder = os.environ.get("COURSE_LAB_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1440, min(max(height + 40, 900), 4000))
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))
        driver.set_window_size(1440, 1800)
