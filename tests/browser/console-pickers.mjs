// The session view's Mode and Model labels and pickers, for tests/browser.rs: one session per
// agent of AGENTS (comma-separated names of the gateway's agents, each an echo agent with its
// own ECHO_AGENT_CONTROLS), created through the form and prompted once; then the first one
// opened again from the list. The last stdout line is the JSON report: for each agent, the ids
// of the four elements the page shows (`mode-label`, `mode-select`, `model-label`,
// `model-select`), and the same for the first agent again as `again`.
import { T, launch } from "./chromium.mjs";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const agents = process.env.AGENTS.split(",");
const report = { steps: [], shown: {}, consoleErrors: [], pageErrors: [] };
const PICKERS = ["mode-label", "mode-select", "model-label", "model-select"];

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("console", (m) => m.type() === "error" && report.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  const shown = async () => {
    const ids = [];
    for (const id of PICKERS) if (await page.isVisible(`#${id}`)) ids.push(id);
    return ids;
  };
  // The open session's transcript holds the echo of `word`, and no turn runs.
  const echoed = async (word) => {
    await page.waitForFunction(
      (w) => [...document.querySelectorAll("#transcript .msg.agent .body")].some((n) => n.textContent === w),
      word,
      { timeout: T },
    );
    await page.waitForFunction(() => document.getElementById("cancel").hidden, null, { timeout: T });
  };

  await page.goto(`${base}/`);
  await page.waitForSelector("#app:not([hidden])", { timeout: T });
  const ids = {};
  for (const agent of agents) {
    const before = await page.evaluate(() => location.hash);
    await page.selectOption("#create-agent", agent);
    await page.fill("#create-cwd", "/tmp");
    await page.click("#create-submit");
    await page.waitForFunction((h) => location.hash.startsWith("#/s/") && location.hash !== h, before, { timeout: T });
    await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
    ids[agent] = decodeURIComponent((await page.evaluate(() => location.hash)).slice(4));
    await page.fill("#prompt", `hello-${agent}`);
    await page.press("#prompt", "Enter");
    await echoed(`hello-${agent}`);
    report.shown[agent] = await shown();
    step(agent);
  }
  // Back to the first session from the list: what the previous one showed is gone.
  await page.click(`#sessions a[data-session-id="${ids[agents[0]]}"]`);
  await page.waitForFunction((h) => location.hash === h, `#/s/${encodeURIComponent(ids[agents[0]])}`, { timeout: T });
  await echoed(`hello-${agents[0]}`);
  report.shown.again = await shown();
  step("again");
} catch (e) {
  report.error = String(e?.stack || e);
} finally {
  await browser.close();
  console.log(JSON.stringify(report));
}

function step(name) {
  report.steps.push(name);
}
