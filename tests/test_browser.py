"""The web demo in a real browser (Debian's chromium through selenium and chromedriver), on a tiny random model
on the CPU: Generate plays audio through the page's Web Audio graph before the server has finished generating,
the page shows the latency it measured, a progress bar and a cut-off result, a waiting request's place in line,
the seed used goes back to the Seed box, Stop leaves the model ready, the text box counts characters and takes
example texts, and bad input shows its message as an error, announced to screen readers.

These tests assert behavior only; benchmarks/demo_latency.py measures the latency. A screenshot of the page at
1366x768 is written to the test's tmp_path. Needs `apt-get install chromium chromium-driver` and `pip install
selenium` (the test extra); skipped without them.
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


def _text(driver, elem_id: str) -> str:
    return driver.find_element("css selector", f"#{elem_id}").text


def _finish(driver) -> dict:
    _wait(driver, "return ['done', 'error', 'stopped'].includes(window.zonosPlayer.stats.state)")
    stats = _stats(driver)
    assert stats["state"] == "done", stats["message"]
    return stats


def test_generate_plays_audio_before_generation_ends(page, tmp_path):
    viewport = page.execute_script("return [window.innerWidth, window.innerHeight]")
    for elem in ("zonos-generate", "zonos-stop", "zonos-status"):
        bottom = page.execute_script(f"return document.getElementById('{elem}').getBoundingClientRect().bottom")
        assert 0 < bottom <= viewport[1], f"#{elem} ends at {bottom}px, below the fold of a {viewport} viewport"

    _generate(page)
    _wait(page, "return window.zonosPlayer.stats.progress > 0")
    progress_shown = page.execute_script("return !document.getElementById('zonos-progress').hidden")
    stats = _finish(page)
    page.save_screenshot(str(tmp_path / "demo.png"))
    assert stats["chunks"] >= 3 and stats["samplesScheduled"] > 0
    # Audio reached the graph while the server was still generating, by the server's own clock.
    assert stats["serverRunningAtFirstAudio"]
    assert stats["firstScheduledWallMs"] < stats["serverEndWallMs"]
    assert 0 < stats["serverTtfaMs"] < stats["clickToFirstAudioMs"]
    shown = re.match(r"first audio (\d+) ms after the click", _text(page, "zonos-latency"))
    assert shown and abs(int(shown[1]) - stats["clickToFirstAudioMs"]) <= 1
    # The progress bar showed while generating and is gone at the end.
    assert progress_shown and stats["progress"] == 1
    assert page.execute_script("return document.getElementById('zonos-progress').hidden")
    # The random model does not end by itself within FRAMES: the page says the budget cut it off, not "Done".
    status = page.find_element("css selector", "#zonos-status")
    assert stats["cutOff"] and status.get_attribute("data-kind") == "warning"
    assert status.text.startswith(f"Cut off: the text reached Max new tokens ({FRAMES} frames, 1.2 s)"), status.text
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_a_waiting_request_shows_its_place_in_line(page):
    assert gi._generation_lock.acquire(timeout=5)  # another request holds the model
    try:
        _generate(page)
        _wait(page, "return window.zonosPlayer.stats.queuedAhead === 1", 10)
        assert _text(page, "zonos-status") == "Waiting for the model: 1 request ahead of yours…"
        assert page.execute_script("return !document.getElementById('zonos-progress').hidden")
    finally:
        gi._generation_lock.release()
    _finish(page)


def test_the_seed_used_is_written_back(page):
    sampling = page.find_element("xpath", "//button[starts-with(normalize-space(), 'Sampling')]")
    sampling.click()  # Gradio renders an accordion's controls once it is opened, a moment after the click
    try:
        _wait(page, "return !!document.querySelector('#zonos-seed input')", 5)
        randomize = page.find_element("xpath", "//label[normalize-space()='Randomize seed']//input")
        randomize.click()
        _generate(page)
        used = _finish(page)["seed"]
        seed_box = "return document.querySelector('#zonos-seed input').value"
        _wait(page, f"{seed_box} === '{used}'", 5)
        assert used != 3  # the page's default seed
        randomize.click()
        time.sleep(0.3)  # Gradio reads the checkbox's value on its change event
        _generate(page)  # not randomized: the seed in the box, the one used last
        assert _finish(page)["seed"] == used
    finally:
        sampling.click()


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


def test_the_text_box_counts_characters_and_takes_examples(page):
    box = page.find_element("css selector", "#zonos-text textarea")
    box.clear()
    box.send_keys("Hello there")
    _wait(page, "return document.getElementById('zonos-chars').textContent.startsWith('11 /')", 5)
    assert _text(page, "zonos-chars") == f"11 / {gi.MAX_TEXT_CHARS:,} characters"
    assert box.get_attribute("aria-describedby") == "zonos-chars"
    long_text = next(text for text, _ in gi.EXAMPLES if len(text) > gi.DEFAULT_MAX_CHARS)
    page.find_element("xpath", f"//*[starts-with(normalize-space(), '{long_text[:30]}')]").click()
    _wait(page, f"return document.querySelector('#zonos-text textarea').value.length === {len(long_text)}", 5)
    _wait(page, f"return document.getElementById('zonos-chars').textContent.startsWith('{len(long_text)} /')", 5)
    assert _text(page, "zonos-chars").endswith("characters · spoken in segments, as one utterance")


def test_bad_input_shows_its_message(page):
    box = page.find_element("css selector", "#zonos-text textarea")
    box.clear()
    box.send_keys(" ")
    time.sleep(0.3)  # Gradio reads the textbox's value on its input event
    _generate(page)
    _wait(page, "return window.zonosPlayer.stats.state === 'error'")
    status = page.find_element("css selector", "#zonos-status")
    assert status.text == "Error: The text is empty: type the sentence to speak."
    # Styled as an error (the red bar beside it), and read out at once by screen readers.
    assert status.get_attribute("data-kind") == "error" and status.get_attribute("role") == "status"
    assert status.get_attribute("aria-live") == "assertive"
    assert status.value_of_css_property("border-left-color") == "rgba(220, 38, 38, 1)"
