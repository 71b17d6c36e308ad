// Agents in the console, for tests/browser/agents.rs: an admin signs in with her key and opens
// the Agents page from the header; the echo agent's terminal login runs in the page (its screen
// read back, the token typed into the page's field), then the registry's echo agent is
// installed with Install, followed until ready, and removed with Remove (confirmed in the
// console's dialog). The last stdout line is the JSON report.
import { T, launch } from "./chromium.mjs";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const report = { consoleErrors: [], pageErrors: [] };
// The page's first requests, before the key is given, are 401: not errors of the run.
let signedIn = false;

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 }, locale: "en-US" });
  page.on("console", (m) => m.type() === "error" && signedIn && report.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  const text = (sel) => page.$eval(sel, (e) => e.textContent);

  await page.goto(`${base}/`);
  await page.waitForSelector("#sign-in:not([hidden])", { timeout: T });
  await page.fill("#api-key", process.env.API_KEY);
  await page.press("#api-key", "Enter");
  await page.waitForSelector("#nav:not([hidden])", { timeout: T });
  signedIn = true;
  await page.click("#nav-agents");
  await page.waitForSelector("#agents-page:not([hidden])", { timeout: T });

  // The terminal login.
  const login = '#agents-list li[data-name="default"] button[data-method="echo-login"]';
  await page.waitForSelector(login, { timeout: T });
  report.loginButton = await text(login);
  await page.click(login);
  const screenHas = (want) =>
    page.waitForFunction((w) => document.getElementById("terminal-screen").textContent.includes(w), want, { timeout: T });
  await screenHas("paste the token here");
  await page.fill("#terminal-input", "token-ok");
  await page.click("#terminal-send");
  await page.waitForFunction(() => document.getElementById("terminal-box").dataset.exit !== undefined, null, { timeout: T });
  report.screen = await text("#terminal-screen");
  report.exit = await page.$eval("#terminal-box", (e) => e.dataset.exit);
  report.loginStatus = await text("#terminal-status");
  await page.click("#terminal-close");

  // The registry: Install, followed until the agent is ready, then Remove.
  await page.waitForSelector('#registry-list li[data-id="echo-acp"]', { timeout: T });
  report.registryIds = await page.$$eval("#registry-list li", (lis) => lis.map((li) => li.dataset.id));
  await page.click('#registry-list li[data-id="echo-acp"] button');
  const state = '#agents-list li[data-name="echo-acp"] [data-role="state"]';
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent === "ready", state, { timeout: T });
  report.installedState = await text(state);
  await page.waitForFunction(
    () => document.querySelector('#registry-list li[data-id="echo-acp"] p.muted')?.textContent.includes("installed as"),
    null,
    { timeout: T },
  );
  report.registryAfterInstall = await text('#registry-list li[data-id="echo-acp"] p.muted');
  await page.click('#agents-list li[data-name="echo-acp"] button.danger');
  await page.waitForSelector("#confirm[open]", { timeout: T });
  await page.click("#confirm-ok");
  await page.waitForFunction(() => !document.querySelector('#agents-list li[data-name="echo-acp"]'), null, { timeout: T });
  report.removed = true;
} catch (e) {
  report.error = String(e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
