// Opens PAGE_URL (served from an origin other than the gateway's) in headless Chromium and
// prints what the page's script reports as one JSON line. Used by tests/browser.rs.
import { chromium } from "playwright-core";

const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage();
  const logs = [];
  page.on("console", (m) => logs.push(m.text()));
  await page.goto(process.env.PAGE_URL);
  const handle = await page.waitForFunction(() => window.result, null, {
    timeout: 60_000,
  });
  console.log(JSON.stringify({ result: await handle.jsonValue(), logs }));
} finally {
  await browser.close();
}
