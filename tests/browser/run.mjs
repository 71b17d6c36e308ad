// Opens PAGE_URL (served from an origin other than the gateway's) in headless Chromium and
// prints what the page's script reports as one JSON line. Used by tests/browser.rs.
import { launch } from "./chromium.mjs";

const browser = await launch();
try {
  const page = await browser.newPage();
  const logs = [];
  page.on("console", (m) => logs.push(m.text()));
  await page.goto(process.env.PAGE_URL);
  const handle = await page.waitForFunction(() => window.result, null, {
    timeout: 60_000,
  });
  const result = await handle.jsonValue();
  // The docs page, if asked: it must render every operation from this gateway alone.
  let docs = null;
  if (process.env.DOCS_URL) {
    const docsPage = await browser.newPage();
    const origin = new URL(process.env.DOCS_URL).origin;
    const elsewhere = [];
    docsPage.on("request", (r) => {
      if (new URL(r.url()).origin !== origin) elsewhere.push(r.url());
    });
    await docsPage.goto(process.env.DOCS_URL);
    await docsPage.waitForFunction(
      () => document.querySelectorAll(".op").length > 0 || document.querySelector(".error"),
      null,
      { timeout: 60_000 },
    );
    docs = await docsPage.evaluate(() => ({
      operations: [...document.querySelectorAll(".op .id")].map((e) => e.textContent),
      error: document.querySelector(".error")?.textContent ?? null,
    }));
    docs.elsewhere = elsewhere;
  }
  console.log(JSON.stringify({ result, docs, logs }));
} finally {
  await browser.close();
}
