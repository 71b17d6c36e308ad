// What turns spent, in the console, for tests/browser/usage.rs: Ann signs in with her key and
// opens her session, on which one turn (prompted by the test through the API) has spent; its
// Usage panel says so. The test prompts again (`PROMPTED` on stdin) and the panel follows that
// turn's `turn_ended` by itself: two turns, their tokens and cost, "—" for what the echo agent
// does not report. Then the header's Usage link: the rows by tenant (the default), then by
// user and session (kept in the address across a reload), the budget alert the second turn
// set off (the lifecycle stream's `usage_budget`), the CSV download, and a session's link back
// to its view. The last stdout line is the JSON report.
import { createInterface } from "node:readline";
import { readFile } from "node:fs/promises";
import { T, launch } from "./chromium.mjs";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const id = process.env.SESSION;
const stdin = createInterface({ input: process.stdin });
const lines = stdin[Symbol.asyncIterator]();
const report = { consoleErrors: [], pageErrors: [] };
// The page's first requests, before the key is given, are 401: not errors of the run.
let signedIn = false;
const next = async (want) => {
  const { value } = await lines.next();
  if (value !== want) throw new Error(`expected ${want}, got ${value}`);
};

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 }, acceptDownloads: true, locale: "en-US" });
  page.on("console", (m) => m.type() === "error" && signedIn && report.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  const text = (sel) => page.$eval(sel, (e) => e.textContent);
  const turnsShown = (n) =>
    page.waitForFunction((want) => document.getElementById("usage-box").dataset.turns === want, String(n), { timeout: T });
  // A table's rows as their cells' text: each row an object by the cells' `data-col`.
  const rows = (sel) =>
    page.$$eval(sel, (trs) => trs.map((tr) => Object.fromEntries([...tr.querySelectorAll("td")].map((td) => [td.dataset.col, td.textContent]))));
  const heads = (sel) => page.$$eval(`${sel} thead th`, (ths) => ths.map((th) => th.textContent));

  await page.goto(`${base}/#/s/${encodeURIComponent(id)}`);
  await page.waitForSelector("#sign-in:not([hidden])", { timeout: T });
  await page.fill("#api-key", process.env.API_KEY);
  await page.press("#api-key", "Enter");
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  signedIn = true;
  await turnsShown(1);
  report.summaryAfterOne = await text("#usage-summary");
  await page.waitForFunction(() => document.getElementById("connection").textContent === "online", null, { timeout: T });
  console.log("OPENED");

  await next("PROMPTED");
  await turnsShown(2);
  report.summary = await text("#usage-summary");
  report.panelOpenBefore = await page.$eval("#usage-box", (d) => d.open);
  await page.click("#usage-box summary");
  report.tableVisible = await page.isVisible("#usage-turns tfoot");
  report.turnHeads = await heads("#usage-turns");
  report.turns = await rows("#usage-turns tbody tr");
  report.turnsTotal = await rows("#usage-turns tfoot tr");
  report.turnsTotalLabel = await text("#usage-turns tfoot th");

  await page.click("#nav-usage");
  await page.waitForSelector("#usage-table tbody tr", { timeout: T });
  report.navCurrent = await page.$eval("#nav-usage", (a) => a.getAttribute("aria-current"));
  report.sessionHidden = await page.$eval("#session", (m) => m.hidden);
  report.byTenantHeads = await heads("#usage-table");
  report.byTenant = await rows("#usage-table tbody tr");

  await page.uncheck("#usage-by-tenant");
  await page.check("#usage-by-user");
  await page.check("#usage-by-session");
  await page.click("#usage-show");
  const bySession = () =>
    page.waitForFunction(
      () => [...document.querySelectorAll("#usage-table thead th")].map((th) => th.textContent).join(",").startsWith("User,Session,"),
      null,
      { timeout: T },
    );
  await bySession();
  report.hash = await page.evaluate(() => location.hash);
  report.bySessionHeads = await heads("#usage-table");
  report.bySession = await rows("#usage-table tbody tr");
  report.bySessionTotal = await rows("#usage-table tfoot tr");
  report.status = await text("#usage-status");

  await page.waitForSelector("#usage-alerts li", { timeout: T });
  report.alerts = await page.$$eval("#usage-alerts li", (lis) => lis.map((li) => li.textContent));
  report.alertBadge = await text("#nav-usage-alerts");

  const [download] = await Promise.all([page.waitForEvent("download", { timeout: T }), page.click("#usage-csv")]);
  report.csv = { name: download.suggestedFilename(), text: await readFile(await download.path(), "utf8") };

  await page.reload();
  await page.waitForSelector("#usage-page:not([hidden])", { timeout: T });
  await bySession();
  report.afterReload = {
    checked: await page.$$eval("#usage-group input:checked", (is) => is.map((i) => i.id)),
    rows: await rows("#usage-table tbody tr"),
  };

  await page.click('#usage-table tbody td[data-col="session"] a');
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  await turnsShown(2);
  report.backTo = await page.evaluate(() => location.hash);
  report.usagePageHidden = await page.$eval("#usage-page", (m) => m.hidden);
} catch (e) {
  report.error = String(e?.stack || e);
} finally {
  await browser.close();
  stdin.close();
  console.log(JSON.stringify(report));
}
