"""The web demo in a real browser (Debian's chromium through selenium and chromedriver), on a tiny random model
on the CPU: Generate plays audio through the page's Web Audio graph before the server has finished generating,
the latency the page measured is printed, Stop leaves the model ready, and bad input shows its message.

A screenshot of the page at 1366x768 is written to the test's tmp_path. Needs `apt-get install chromium
chromium-driver` and `pip install selenium` (the test extra); skipped without them.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import numpy as np
import pytest
import soundfile as sf
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
pytest.importorskip("gradio")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")

import gradio_interface as gi  # noqa: E402
from tests.test_gradio_interface import serve  # noqa: E402
from tests.tiny import tiny_model  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromedriver (apt-get install chromium chromium-driver)",
)
# About 3 s of generation on a busy 2-core CPU: long enough that the first chunk plays well before the end.
FRAMES = 100
# The player's script has run and Gradio has rendered the buttons and the player's status line.
PAGE_READY = (
    "return !!(window.zonosPlayer && document.querySelector('#zonos-generate') && "
    "document.querySelector('#zonos-stop') && document.querySelector('#zonos-status'))"
)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    from selenium.webdriver.chrome.service import Service

    model = tiny_model(tmp_path_factory.mktemp("hybrid"), max_seqlen=512)
    defaults = gi.SynthesisRequest(
        text="Hello from the browser test.", randomize_seed=False, seed=3, max_new_tokens=FRAMES
    )
    app = gi.build_app(
        lambda name: model, ["tiny"], first_chunk_frames=1, chunk_frames=16, device="cpu", defaults=defaults
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--autoplay-policy=no-user-gesture-required",
        "--window-size=1366,768",
    ):
        options.add_argument(arg)
    # The model computes on one core and leaves the other to chromium, as a browser on its own machine (or
    # cores) would be: on 2 cores both busy, the page's handling of the first chunk waited for the scheduler.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with serve(app) as url:
            driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
            try:
                driver.set_script_timeout(30)
                driver.get(url)
                _wait(driver, PAGE_READY, 30)
                yield driver
            finally:
                driver.quit()
    finally:
        torch.set_num_threads(threads)


def _wait(driver, script: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for: {script}")


def _stats(driver) -> dict:
    return driver.execute_script("return Object.assign({}, window.zonosPlayer.stats)")


def _click(driver, elem_id: str) -> None:
    driver.find_element("css selector", f"#{elem_id}").click()


def _generate(driver) -> None:
    """Click Generate and wait until the page has started this click's request: until then the stats are the
    previous request's (its 'done' state and counts), which a wait for this one's end would read as its own."""
    before = _stats(driver)["requests"]
    _click(driver, "zonos-generate")
    _wait(driver, f"return window.zonosPlayer.stats.requests > {before}", 5)


def test_generate_plays_audio_before_generation_ends(page, tmp_path):
    viewport = page.execute_script("return [window.innerWidth, window.innerHeight]")
    for elem in ("zonos-generate", "zonos-stop", "zonos-status"):
        bottom = page.execute_script(f"return document.getElementById('{elem}').getBoundingClientRect().bottom")
        assert 0 < bottom <= viewport[1], f"#{elem} ends at {bottom}px, below the fold of a {viewport} viewport"

    _generate(page)
    _wait(page, "return ['done', 'error', 'stopped'].includes(window.zonosPlayer.stats.state)")
    stats = _stats(page)
    page.save_screenshot(str(tmp_path / "demo.png"))
    assert stats["state"] == "done", stats["message"]
    assert stats["chunks"] >= 3 and stats["samplesScheduled"] > 0
    # Audio reached the graph while the server was still generating, by the server's own clock.
    assert stats["serverRunningAtFirstAudio"]
    assert stats["firstScheduledWallMs"] < stats["serverEndWallMs"] - 100
    latency, server = stats["clickToFirstAudioMs"], stats["serverTtfaMs"]
    print(
        f"\nclick to first audio scheduled: {latency:.0f} ms in the browser (server TTFA {server:.0f} ms, "
        f"request sent after {stats['clickToFetchMs']:.0f} ms, response after {stats['clickToResponseMs']:.0f} ms, "
        f"output latency {stats['outputLatencyMs']:.0f} ms, {stats['chunks']} chunks, {stats['underruns']} gaps); "
        f"screenshot {tmp_path / 'demo.png'}"
    )
    # The target is the server's TTFA + 100 ms (+36-95 ms measured on 2 cores shared with other jobs); the bound
    # leaves room for a busier runner and still fails for a buffering path (Gradio's audio added ~1300 ms).
    assert 0 < server < latency < server + 250
    shown = re.match(r"first audio (\d+) ms after the click", page.find_element("css selector", "#zonos-latency").text)
    assert shown and abs(int(shown[1]) - latency) <= 1
    assert page.find_element("css selector", "#zonos-status").text.startswith("Done: ")
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_stop_then_generate_again(page):
    _generate(page)
    _wait(page, "return window.zonosPlayer.stats.samplesScheduled > 0")
    _click(page, "zonos-stop")
    _wait(page, "return window.zonosPlayer.stats.state === 'stopped'")
    assert page.find_element("css selector", "#zonos-status").text.startswith("Stopped after ")
    deadline = time.monotonic() + 1.0  # well before the rest of the request would have been generated
    while gi._generation_lock.locked():  # the server saw the closed stream and released the model
        assert time.monotonic() < deadline, "Stop did not end generation on the server"
        time.sleep(0.01)
    _generate(page)  # the closed stream released the model: the next request runs at once
    _wait(page, "return ['done', 'error'].includes(window.zonosPlayer.stats.state)")
    stats = _stats(page)
    assert stats["state"] == "done", stats["message"]
    assert stats["samplesScheduled"] > 0


def test_generate_while_playing_restarts(page):
    _generate(page)
    _wait(page, "return window.zonosPlayer.stats.samplesScheduled > 0")
    _generate(page)  # a new request replaces the playing one
    _wait(page, "return ['done', 'error'].includes(window.zonosPlayer.stats.state)")
    stats = _stats(page)
    assert stats["state"] == "done", stats["message"]
    assert stats["samplesScheduled"] > 0


def test_uploaded_prefix_is_continued(page, tmp_path):
    clip = tmp_path / "prefix.wav"
    sf.write(clip, 0.3 * np.random.default_rng(0).standard_normal(22050).astype(np.float32), 44100)
    page.find_element("xpath", "//button[@role='tab'][normalize-space()='Prefix']").click()
    page.find_element("css selector", "#zonos-prefix input[type=file]").send_keys(str(clip))
    _wait(page, "return !!document.querySelector('#zonos-prefix audio, #zonos-prefix .waveform-container')", 15)
    _generate(page)
    _wait(page, "return ['done', 'error'].includes(window.zonosPlayer.stats.state)")
    stats = _stats(page)
    assert stats["state"] == "done", stats["message"]
    assert stats["prefixFrames"] == 44  # 0.5 s at 44.1 kHz, padded to whole 512-sample frames
    assert stats["samplesScheduled"] > 44 * 512  # the decoded prefix plays first, then the continuation
    page.find_element("css selector", "#zonos-prefix button[aria-label='Clear']").click()


def test_bad_input_shows_its_message(page):
    box = page.find_element("css selector", "textarea")
    box.clear()
    box.send_keys(" ")
    time.sleep(0.3)  # Gradio reads the textbox's value on its input event
    _generate(page)
    _wait(page, "return window.zonosPlayer.stats.state === 'error'")
    assert page.find_element("css selector", "#zonos-status").text == (
        "Error: The text is empty: type the sentence to speak."
    )
