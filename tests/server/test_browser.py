#!/usr/bin/env python3
"""The chat page in headless Chromium (Selenium): a message typed and sent streams a reply equal to what
/v1/chat/completions returns for the same request at temperature 0; a screenshot is left in the artefacts folder.
Exits 77 (skipped) when Chromium or its driver is not installed (scripts/test.sh installs them)."""
import os
import shutil
import sys
import unittest

import server_util
from server_util import MODEL, Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SKIP = 77


class Browser(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        cls.server = Server("--parallel", "2")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--window-size=1000,700"):
            options.add_argument(arg)
        # The driver is Debian's, named outright: Selenium would otherwise try to download one.
        cls.driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        cls.server.stop()

    def test_streamed_reply_matches_the_api(self):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
        message, max_tokens = "Good morrow, sweet lady", 48
        d = self.driver
        d.get(f"{self.server.url}/?temperature=0&max_tokens={max_tokens}")
        WebDriverWait(d, 30).until(lambda d: d.find_element(By.ID, "model").text.startswith(MODEL))
        d.find_element(By.ID, "input").send_keys(message)
        d.find_element(By.ID, "send").click()
        reply = WebDriverWait(d, 60).until(
            lambda d: d.find_element(By.CSS_SELECTOR, "#reply[data-done='true']"))
        text = reply.get_attribute("textContent")
        status = d.find_element(By.ID, "status").text
        server_util.ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = server_util.ARTIFACTS / "chat_page.png"
        d.save_screenshot(str(shot))
        print(f"screenshot: {shot}")
        want = self.server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": message}], temperature=0, max_tokens=max_tokens)
        self.assertNotIn("error", reply.get_attribute("class"))
        self.assertEqual(text, want.choices[0].message.content)
        self.assertRegex(status, r"\d+ tokens, [\d.]+ tokens/s")  # the page shows the speed


if __name__ == "__main__":
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        print(f"skipped: {CHROMIUM} or {DRIVER} missing (apt-get install chromium chromium-driver)")
        sys.exit(SKIP)
    server_util.main(__name__)
