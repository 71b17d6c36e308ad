// The console signing in with an OpenID provider, for tests/oidc.rs: the page offers the
// provider, its sign-in pages take a login (the tenant) and a consent, the console comes back
// with a token and works (a session created and prompted); the token is refreshed before it
// expires and the console goes on working past its first token's life (its streams moved off
// that token: a refresh reopens them, so that none gets a 401). The last stdout line is the
// JSON report.
import { T, launch } from "./chromium.mjs";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const login = process.env.LOGIN;
const ttl = Number(process.env.CONSOLE_TTL) * 1000;
const origin = new URL(base).origin;
const report = { steps: [], consoleErrors: [], pageErrors: [] };
// Errors of the console's own page once signed in (the provider's pages are not ours).
let signedIn = false;

const browser = await launch();
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
try {
  page.on("console", (m) => {
    if (m.type() === "error" && signedIn && new URL(page.url()).origin === origin) report.consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  const step = (name) => report.steps.push(name);
  const token = () => page.evaluate(() => sessionStorage.getItem("acp-console.key"));
  const agentSays = (needle) =>
    page.waitForFunction(
      (n) => [...document.querySelectorAll("#transcript .msg.agent .body")].some((b) => b.textContent.includes(n)),
      needle,
      { timeout: T },
    );
  const create = async () => {
    const before = await page.$$eval("#sessions a[data-session-id]", (as) => as.length);
    await page.fill("#create-cwd", "/tmp");
    await page.click("#create button[type=submit]");
    await page.waitForFunction((n) => document.querySelectorAll("#sessions a[data-session-id]").length > n, before, {
      timeout: T,
    });
  };

  await page.goto(`${base}/`);
  await page.waitForSelector("#oidc-sign-in:not([hidden])", { timeout: T });
  report.button = await page.$eval("#oidc-sign-in", (b) => b.textContent);
  step("offered");
  await page.click("#oidc-sign-in");
  await page.waitForSelector("input[name=login]", { timeout: T });
  report.providerPage = new URL(page.url()).origin !== new URL(base).origin;
  await page.fill("input[name=login]", login);
  await page.fill("input[name=password]", "any");
  await page.click("button[type=submit]");
  await page.waitForSelector("button[type=submit]", { timeout: T });
  if (await page.$("input[name=prompt][value=consent]")) await page.click("button[type=submit]");
  await page.waitForSelector("#app:not([hidden])", { timeout: T });
  report.backAt = page.url();
  const first = await token();
  report.tokenIsJwt = first?.split(".").length === 3;
  signedIn = true;
  step("signed-in");

  await create();
  await page.fill("#prompt", "hello from the console");
  await page.press("#prompt", "Enter");
  await agentSays("hello from the console");
  step("prompted");

  // Past the first token's life: refreshed, and the console still creates and prompts, and its
  // list still follows (the new session appears through the lifecycle stream).
  await page.waitForTimeout(ttl + 2000);
  report.refreshed = (await token()) !== first;
  await create();
  await page.fill("#prompt", "still here");
  await page.press("#prompt", "Enter");
  await agentSays("still here");
  report.sessions = await page.$$eval("#sessions a[data-session-id]", (as) => as.map((a) => a.dataset.sessionId));
  step("past-expiry");
} catch (e) {
  report.error = String(e?.stack || e);
  report.at = page.url();
  report.text = (await page.textContent("body").catch(() => "")).slice(0, 500);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
