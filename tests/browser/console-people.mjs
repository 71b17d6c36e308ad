// The console with several people on one session, for tests/browser/people.rs: Ann signs in
// with her key and opens her session; Cy (the Rust test) starts watching it, and the page says
// so; Cy's turn shows as Cy's, and while it runs Ann's prompts go into the queue (the Send
// button reads "Queue"); she withdraws one; she answers Cy's permission request, noted as hers;
// her queued prompt then runs, shown as hers, and the queue empties. The test's steps come in
// on stdin (`CY_WATCHING`, `CY_PROMPTED`); the last stdout line is the JSON report.
import { createInterface } from "node:readline";
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
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => m.type() === "error" && signedIn && report.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  const text = (sel) => page.$eval(sel, (e) => e.textContent);
  const waitText = (sel, part) =>
    page.waitForFunction(([s, p]) => document.querySelector(s)?.textContent.includes(p), [sel, part], { timeout: T });
  const queued = () =>
    page.$$eval("#queue-list li", (lis) => lis.map((li) => [li.querySelector(".who").textContent, li.querySelector(".body").textContent]));
  const whoSaid = () =>
    page.$$eval("#transcript .msg.user", (ms) => ms.map((m) => [m.querySelector(".who").textContent, m.querySelector(".body").textContent.trim()]));

  await page.goto(`${base}/#/s/${encodeURIComponent(id)}`);
  await page.waitForSelector("#sign-in:not([hidden])", { timeout: T });
  await page.fill("#api-key", process.env.ANN_KEY);
  await page.press("#api-key", "Enter");
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  signedIn = true;
  await waitText("#watchers", "ann");
  await page.waitForFunction(() => document.getElementById("connection").textContent === "online", null, { timeout: T });
  report.watchersAlone = await text("#watchers");
  console.log("OPENED");

  await next("CY_WATCHING");
  await waitText("#watchers", "cy");
  report.watchersBoth = await text("#watchers");
  console.log("SEEN");

  await next("CY_PROMPTED");
  await page.waitForSelector("#requests section.permission", { timeout: T });
  await page.waitForFunction(() => document.getElementById("send").textContent === "Queue", null, { timeout: T });
  report.sendReads = await text("#send");
  for (const prompt of ["first of ann's", "second of ann's"]) {
    await page.fill("#prompt", prompt);
    await page.press("#prompt", "Enter");
    await page.waitForFunction((p) => [...document.querySelectorAll("#queue-list .body")].some((b) => b.textContent === p), prompt, { timeout: T });
  }
  report.queued = await queued();
  await page.click("#queue-list li:nth-child(2) button");
  await page.waitForFunction(() => document.querySelectorAll("#queue-list li").length === 1, null, { timeout: T });
  report.afterWithdraw = await queued();

  await page.click('#requests section.permission button[data-option-id="allow"]');
  await waitText("#transcript", "(answered by ann)");
  await page.waitForFunction(() => document.getElementById("queue-box").hidden, null, { timeout: T });
  await page.waitForFunction(() => [...document.querySelectorAll("#transcript .msg.user .body")].some((b) => b.textContent.includes("first of ann's")), null, { timeout: T });
  await page.waitForFunction(() => document.getElementById("send").textContent === "Send", null, { timeout: T });
  report.said = await whoSaid();
  report.notes = await page.$$eval("#transcript .note", (ns) => ns.map((n) => n.textContent));
} catch (e) {
  report.error = String(e?.stack || e);
} finally {
  await browser.close();
  stdin.close();
  console.log(JSON.stringify(report));
}
