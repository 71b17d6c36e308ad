// Drives the gateway's own console (GATEWAY_URL + "/") in headless Chromium for tests/browser.rs:
// create a session, prompt and watch the text stream in, agent text with HTML in it rendered as
// text, a permission answered, a reload mid-turn, a gateway restart mid-stream (asked of the
// Rust test with a "RESTART" line on stdout, answered "RESTARTED" on stdin), mode and model
// switched. Screenshots go to SHOTS_DIR. The last stdout line is the JSON report.
import { T, launch } from "./chromium.mjs";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const origin = new URL(base).origin;
const shots = process.env.SHOTS_DIR;
mkdirSync(shots, { recursive: true });
const stdin = createInterface({ input: process.stdin });
const lines = stdin[Symbol.asyncIterator]();

const report = { steps: [], consoleErrors: [], restartErrors: [], elsewhere: [], pageErrors: [] };
let phase = "normal";

const browser = await launch();
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    (phase === "restart" ? report.restartErrors : report.consoleErrors).push(m.text());
  });
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  page.on("request", (r) => {
    const u = new URL(r.url());
    if (u.protocol !== "data:" && u.origin !== origin) report.elsewhere.push(r.url());
  });
  page.on("dialog", (d) => {
    report.pageErrors.push(`a dialog opened: ${d.message()}`);
    d.dismiss();
  });

  const step = (name) => report.steps.push(name);
  const agentTexts = () => page.$$eval("#transcript .msg.agent .body", (ns) => ns.map((n) => n.textContent));
  const userTexts = () => page.$$eval("#transcript .msg.user .body", (ns) => ns.map((n) => n.textContent));
  const lastAgent = async () => (await agentTexts()).at(-1) ?? "";
  // The agent message number `index` (counted from 0 in the transcript) contains `needle`.
  const waitAgent = (needle, index) =>
    page.waitForFunction(
      ([n, i]) => [...document.querySelectorAll("#transcript .msg.agent .body")][i]?.textContent.includes(n),
      [needle, index],
      { timeout: T },
    );
  const count = async () => (await agentTexts()).length;
  const idle = () =>
    page.waitForFunction(() => document.getElementById("cancel").hidden, null, { timeout: T });
  // Sends `text` with Enter; returns the index its reply will have.
  const prompt = async (text) => {
    const k = await count();
    await page.fill("#prompt", text);
    await page.press("#prompt", "Enter");
    return k;
  };
  const chunks = (n) => Array.from({ length: n }, (_, i) => `c${i + 1}`).join(" ");

  // 1. The page, with its CSP.
  const res = await page.goto(`${base}/`);
  report.csp = res.headers()["content-security-policy"];
  report.contentType = res.headers()["content-type"];
  await page.waitForSelector("#app:not([hidden])", { timeout: T });
  step("loaded");

  // 2. Create a session.
  await page.fill("#create-cwd", "/tmp");
  await page.click("#create-submit");
  await page.waitForFunction(() => location.hash.startsWith("#/s/"), null, { timeout: T });
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  report.sessionId = decodeURIComponent((await page.evaluate(() => location.hash)).slice(4));
  await page.waitForSelector(`#sessions a[data-session-id="${report.sessionId}"]`, { timeout: T });
  step("created");

  // 3. Prompt; the text streams in, Markdown rendered.
  let k = await prompt("hello **big** world");
  await waitAgent("world", k);
  await idle();
  report.firstReply = await lastAgent();
  report.strong = await page.$$eval("#transcript .msg.agent strong", (ns) => ns.map((n) => n.textContent));
  report.listedTitle = await page.waitForFunction(
    (id) => {
      const t = document.querySelector(`#sessions a[data-session-id="${id}"] .title`)?.textContent;
      return t && t !== "(untitled)" ? t : null;
    },
    report.sessionId,
    { timeout: T },
  ).then((h) => h.jsonValue());
  step("prompted");

  // 4. Agent text with HTML in it stays text and runs nothing.
  k = await prompt("<img src=x onerror=window.__xss=1> <script>window.__xss=2</script> done");
  await waitAgent("done", k);
  await idle();
  report.xss = await page.evaluate(() => ({
    ran: window.__xss ?? null,
    imgs: document.querySelectorAll("#transcript img, #requests img").length,
    scripts: document.querySelectorAll("#transcript script").length,
    text: [...document.querySelectorAll("#transcript .msg.agent .body")].at(-1).textContent,
  }));
  step("xss");

  // 5. A permission request, answered with a button; the agent also suggests two prompts.
  k = await prompt("/suggest again /suggest more /permission please");
  const allow = await page.waitForSelector('.request.permission button[data-option-id="allow"]', { timeout: T });
  await allow.focus();
  await page.keyboard.press("Enter");
  await waitAgent("please", k);
  await idle();
  report.permissionReply = await lastAgent();
  report.pendingAfter = await page.$$eval("#requests .request", (ns) => ns.length);
  const suggested = () => page.$$eval("#prompt-suggestions:not([hidden]) button", (bs) => bs.map((b) => b.textContent));
  report.suggested = await suggested();
  await page.click("#prompt-suggestions button");
  report.suggestionFilled = await page.inputValue("#prompt");
  await page.fill("#prompt", "");
  step("permission");
  await page.screenshot({ path: `${shots}/console-1280x800.png` });

  // 6. Reload mid-turn: the transcript continues, nothing missing or doubled.
  k = await prompt("/chunks 30 /delay 80 go");
  await waitAgent("c5 ", k);
  await page.reload();
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  await waitAgent("c30", k);
  await idle();
  report.reloadReply = await lastAgent();
  report.suggestedAfterReload = await suggested();
  report.expectedReload = chunks(30);
  report.userAfterReload = await userTexts();
  report.agentCountAfterReload = (await agentTexts()).length;
  report.lastSeqStored = await page.evaluate(
    (id) => Number(sessionStorage.getItem(`acp-console.last.${id}`)),
    report.sessionId,
  );
  report.lastSeqShown = await page.evaluate(() => Number(document.getElementById("transcript").dataset.lastSeq));
  step("reload");

  // 7. Mode and model pickers.
  await page.waitForSelector("#mode-select:not([hidden])", { timeout: T });
  report.pickersShown = [];
  for (const id of ["mode-label", "mode-select", "model-label", "model-select"]) {
    if (await page.isVisible(`#${id}`)) report.pickersShown.push(id);
  }
  report.modesOffered = await page.$$eval("#mode-select option", (os) => os.map((o) => o.value));
  report.modelsOffered = await page.$$eval("#model-select option", (os) => os.map((o) => o.value));
  let put = page.waitForResponse((r) => r.url().endsWith("/mode") && r.request().method() === "PUT");
  await page.selectOption("#mode-select", "code");
  report.modeStatus = (await put).status();
  put = page.waitForResponse((r) => r.url().endsWith("/model") && r.request().method() === "PUT");
  await page.selectOption("#model-select", "echo-large");
  report.modelStatus = (await put).status();
  await page.reload();
  await page.waitForSelector("#mode-select:not([hidden])", { timeout: T });
  await page.waitForFunction(() => document.getElementById("transcript").dataset.lastSeq !== "0", null, { timeout: T });
  report.modeAfterReload = await page.$eval("#mode-select", (s) => s.value);
  report.modelAfterReload = await page.$eval("#model-select", (s) => s.value);
  report.sessionError = await page.$eval("#session-error", (e) => e.textContent);
  step("controls");

  // 8. The gateway restarts mid-stream; the page resumes from the last event id.
  k = await prompt("/chunks 200 /delay 50 long");
  await waitAgent("c5 ", k);
  const before = await lastAgent();
  await page.evaluate(() => {
    window.__states = [];
    new MutationObserver(() => window.__states.push(document.getElementById("connection").textContent))
      .observe(document.getElementById("connection"), { childList: true, characterData: true, subtree: true });
  });
  phase = "restart";
  console.log("RESTART");
  const answer = await lines.next();
  if (answer.value !== "RESTARTED") throw new Error(`unexpected answer ${answer.value}`);
  // The interrupted turn ends (the agent went with the old gateway); then the page prompts again.
  await idle();
  await page.waitForFunction(() => document.getElementById("connection").textContent === "online", null, { timeout: T });
  phase = "normal";
  report.connectionStates = await page.evaluate(() => window.__states);
  report.beforeRestart = before;
  report.interrupted = (await agentTexts()).at(-1);
  k = await prompt("after the restart");
  await waitAgent("restart", k);
  await idle();
  report.afterRestart = await lastAgent();
  report.userFinal = await userTexts();
  report.notes = await page.$$eval("#transcript .note", (ns) => ns.map((n) => n.textContent));
  // Everything once: the page's transcript against a fresh load of the log.
  const live = await agentTexts();
  await page.reload();
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  await waitAgent("restart", k);
  report.sameAfterReload = JSON.stringify(await agentTexts()) === JSON.stringify(live);
  step("restart");

  // 9. A phone.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(200);
  report.phoneOverflow = await page.evaluate(() => document.documentElement.scrollWidth > 390);
  await page.screenshot({ path: `${shots}/console-390x844.png`, fullPage: false });
  step("phone");
  await page.emulateMedia({ colorScheme: "dark" });
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.waitForTimeout(200);
  report.darkBackground = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  await page.screenshot({ path: `${shots}/console-dark-1280x800.png` });
  step("dark");
} catch (e) {
  report.error = String(e?.stack || e);
} finally {
  await browser.close();
  console.log(JSON.stringify(report));
  stdin.close();
}
