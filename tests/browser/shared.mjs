// A share link's page in Chromium, for tests/browser/shared.rs: opened without a key, it shows
// the session's title and transcript; the test prompts again (`PROMPTED` on stdin) and the
// page, following the live link, shows that turn too. Then a revoked link's page says it does
// not open. The last stdout line is the JSON report.
import { createInterface } from "node:readline";
import { T, launch } from "./chromium.mjs";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const stdin = createInterface({ input: process.stdin });
const lines = stdin[Symbol.asyncIterator]();
const report = { consoleErrors: [], pageErrors: [] };
const next = async (want) => {
  const { value } = await lines.next();
  if (value !== want) throw new Error(`expected ${want}, got ${value}`);
};

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => m.type() === "error" && report.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  const transcriptHas = (text) =>
    page.waitForFunction((t) => document.getElementById("transcript").textContent.includes(t), text, { timeout: T });

  await page.goto(`${base}${process.env.SHARE_PATH}`);
  await transcriptHas("hello shared world");
  await page.waitForFunction(() => document.getElementById("shared-state").textContent === "live", null, { timeout: T });
  report.title = await page.textContent("#shared-title");
  report.about = await page.textContent("#shared-about");
  report.prompts = await page.$$eval(".msg.user", (ms) => ms.length);
  report.noPromptBox = (await page.$("#prompt")) === null;
  console.log("OPENED");

  await next("PROMPTED");
  // The answer, not only the prompt, which says the same words.
  await page.waitForFunction(
    () => [...document.querySelectorAll(".msg.agent")].some((m) => m.textContent.includes("the second turn")),
    null,
    { timeout: T },
  );
  report.promptsAfter = await page.$$eval(".msg.user", (ms) => ms.length);
  report.answers = await page.$$eval(".msg.agent", (ms) => ms.map((m) => m.textContent));

  const revoked = await browser.newPage();
  revoked.on("pageerror", (e) => report.pageErrors.push(String(e)));
  await revoked.goto(`${base}${process.env.REVOKED_PATH}`);
  await revoked.waitForFunction(() => document.getElementById("shared-state").textContent === "unavailable", null, { timeout: T });
  report.revoked = await revoked.textContent("#shared-about");
} catch (e) {
  report.error = String(e && e.stack ? e.stack : e);
} finally {
  await browser.close();
  stdin.close();
  console.log(JSON.stringify(report));
}
