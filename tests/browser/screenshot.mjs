// Makes docs/console.png: the console of a gateway started with the README's command (the
// default echo agent, which offers no modes or models), at 1280×800 in the light scheme, after
// two sessions are created and one is prompted (Markdown, a permission answered).
//
// Not run by CI or tests/browser.rs. By hand, from the repository root, after `npm ci` in
// tests/browser: build and start the gateway as the README does, with no acp-gateway.db in the
// repository root yet and a fresh TMPDIR (the echo agent's state), so that the session list
// holds only what this script creates; then, in another shell, run the script:
//
//   cargo build --release --bin acp-gateway --example echo_agent
//   TMPDIR=$(mktemp -d) ./target/release/acp-gateway --agent ./target/release/examples/echo_agent
//   node tests/browser/screenshot.mjs
//
// GATEWAY_URL (default http://127.0.0.1:8080), OUT (default docs/console.png) and CHROMIUM
// (default /usr/bin/chromium) change what it talks to and writes. It fails, writing nothing,
// when the page shows a Mode or Model label or picker, or the browser reports an error.
import { T, launch } from "./chromium.mjs";

const base = (process.env.GATEWAY_URL || "http://127.0.0.1:8080").replace(/\/$/, "");
const out = process.env.OUT || "docs/console.png";

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 }, colorScheme: "light" });
  const errors = [];
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  page.on("pageerror", (e) => errors.push(String(e)));
  const agentCount = () => page.$$eval("#transcript .msg.agent", (ns) => ns.length);
  const prompt = async (text, needle, answer) => {
    const k = await agentCount();
    await page.fill("#prompt", text);
    await page.press("#prompt", "Enter");
    if (answer) await (await page.waitForSelector(`.request.permission button[data-option-id="${answer}"]`, { timeout: T })).click();
    await page.waitForFunction(
      ([n, i]) => [...document.querySelectorAll("#transcript .msg.agent .body")][i]?.textContent.includes(n),
      [needle, k],
      { timeout: T },
    );
    await page.waitForFunction(() => document.getElementById("cancel").hidden, null, { timeout: T });
  };
  const create = async (cwd) => {
    const before = await page.evaluate(() => location.hash);
    await page.fill("#create-cwd", cwd);
    await page.click("#create-submit");
    await page.waitForFunction((h) => location.hash.startsWith("#/s/") && location.hash !== h, before, { timeout: T });
    await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  };

  await page.goto(`${base}/`);
  await page.waitForSelector("#app:not([hidden])", { timeout: T });
  await create("/usr/src");
  await prompt("Check the links on the home page", "home page");
  await create("/tmp");
  await prompt("hello **big** world", "world");
  await prompt("Run the `unit` tests, then the *browser* tests", "browser");
  await prompt("/permission may I edit src/main.rs?", "main.rs", "allow");
  await page.waitForFunction(
    () =>
      [...document.querySelectorAll("#sessions .title")].every((t) => t.textContent !== "(untitled)") &&
      ![...document.querySelectorAll("#sessions .badge")].some((b) => b.textContent === "running"),
    null,
    { timeout: T },
  );
  for (const id of ["mode-label", "mode-select", "model-label", "model-select"]) {
    if (await page.isVisible(`#${id}`)) throw new Error(`#${id} is visible; the default echo agent offers no modes or models`);
  }
  if (errors.length) throw new Error(`the page reported errors: ${errors.join("; ")}`);
  await page.evaluate(() => {
    document.activeElement?.blur();
    window.scrollTo(0, 0);
  });
  await page.screenshot({ path: out });
  console.log(`wrote ${out}`);
} finally {
  await browser.close();
}
