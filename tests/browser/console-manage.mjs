// The console with API keys, for tests/browser.rs: sign-in (a wrong key, then the right one),
// a session created by another client appearing in the list live (asked of the Rust test with
// "CREATE", answered "CREATED <id>"), slash commands suggested from the agent's
// availableCommands, the plan and usage, an elicitation answered through its form, rename,
// archive and the archived filter, delete after a confirmation, sign-out. The last stdout line is
// the JSON report.
import { T, launch } from "./chromium.mjs";
import { createInterface } from "node:readline";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const origin = new URL(base).origin;
const key = process.env.API_KEY;
const stdin = createInterface({ input: process.stdin });
const lines = stdin[Symbol.asyncIterator]();
const report = { steps: [], consoleErrors: [], signInErrors: [], elsewhere: [], pageErrors: [] };
let phase = "sign-in";

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("console", (m) => {
    if (m.type() === "error") (phase === "sign-in" ? report.signInErrors : report.consoleErrors).push(m.text());
  });
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  page.on("request", (r) => {
    const u = new URL(r.url());
    if (u.protocol !== "data:" && u.origin !== origin) report.elsewhere.push(r.url());
  });
  const step = (name) => report.steps.push(name);
  const agentTexts = () => page.$$eval("#transcript .msg.agent .body", (ns) => ns.map((n) => n.textContent));
  const waitAgent = (needle, index) =>
    page.waitForFunction(
      ([n, i]) => [...document.querySelectorAll("#transcript .msg.agent .body")][i]?.textContent.includes(n),
      [needle, index],
      { timeout: T },
    );
  const idle = () => page.waitForFunction(() => document.getElementById("cancel").hidden, null, { timeout: T });
  const prompt = async (text) => {
    const k = (await agentTexts()).length;
    await page.fill("#prompt", text);
    await page.press("#prompt", "Enter");
    return k;
  };
  const listed = (id) => page.$(`#sessions a[data-session-id="${id}"]`);

  // Sign-in: asked for, a wrong key refused, the right one kept in sessionStorage.
  await page.goto(`${base}/`);
  await page.waitForSelector("#sign-in:not([hidden])", { timeout: T });
  report.appHiddenBeforeKey = await page.$eval("#app", (e) => e.hidden);
  await page.fill("#api-key", "not-the-key-0123456789");
  await page.press("#api-key", "Enter");
  await page.waitForFunction(() => document.getElementById("sign-in-error").textContent !== "", null, { timeout: T });
  report.wrongKeyError = await page.$eval("#sign-in-error", (e) => e.textContent);
  await page.fill("#api-key", key);
  await page.press("#api-key", "Enter");
  await page.waitForSelector("#app:not([hidden])", { timeout: T });
  report.keyStored = (await page.evaluate(() => sessionStorage.getItem("acp-console.key"))) === key;
  phase = "normal";
  step("signed-in");

  // A session created elsewhere appears in the list without a reload.
  await page.waitForFunction(() => document.getElementById("connection").textContent === "online", null, { timeout: T });
  await page.waitForTimeout(300); // the lifecycle stream is open
  // Paging: 31 sessions in "/" (made by the Rust test), the cwd filter, "More sessions".
  console.log("MANY");
  if ((await lines.next()).value !== "MADE") throw new Error("no sessions made");
  await page.click("#filter-box summary");
  await page.fill("#filter-cwd", "/");
  await page.press("#filter-cwd", "Enter");
  await page.waitForFunction(() => document.querySelectorAll("#sessions li").length === 30, null, { timeout: T });
  report.moreVisible = await page.$eval("#more", (e) => !e.hidden);
  await page.click("#more");
  await page.waitForFunction(() => document.querySelectorAll("#sessions li").length === 31, null, { timeout: T });
  report.moreAfterLast = await page.$eval("#more", (e) => !e.hidden);
  report.cwds = [...new Set(await page.$$eval("#sessions .sub", (ns) => ns.map((n) => n.textContent.split(" · ").at(-1))))];
  await page.fill("#filter-cwd", "");
  await page.press("#filter-cwd", "Enter");
  await page.click("#filter-box summary");
  step("paging");

  console.log("CREATE");
  const created = (await lines.next()).value;
  const [, id, pruned] = created.split(" ");
  report.sessionId = id;
  await page.waitForFunction(
    (sid) => document.querySelector(`#sessions a[data-session-id="${sid}"] .title`)?.textContent === "Echo: from curl",
    id,
    { timeout: T },
  );
  step("live-list");

  // A session whose oldest events retention removed: the transcript says so, then continues.
  await page.goto(`${base}/#/s/${encodeURIComponent(pruned)}`);
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  await page.waitForFunction(() => document.getElementById("transcript").dataset.lastSeq !== "0", null, { timeout: T });
  report.gapNotes = await page.$$eval("#transcript .note.gap", (ns) => ns.map((n) => n.textContent));
  report.prunedText = await agentTexts();
  await page.goto(`${base}/`);
  await page.waitForSelector("#app:not([hidden])", { timeout: T });
  step("gap");

  // Open it from the list with the keyboard.
  await page.focus(`#sessions a[data-session-id="${id}"]`);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#session-view:not([hidden])", { timeout: T });
  await waitAgent("from curl", 0);
  step("opened");

  // /state: commands, plan, usage.
  let k = await prompt("/state hi");
  await waitAgent("hi", k);
  await idle();
  report.plan = await page.$$eval("#transcript .plan li", (ns) => ns.map((n) => `${n.className}: ${n.textContent}`));
  report.usage = await page.$eval("#session-usage", (e) => e.textContent);
  await page.fill("#prompt", "");
  await page.type("#prompt", "/sh");
  await page.waitForSelector("#suggestions:not([hidden])", { timeout: T });
  report.suggested = await page.$$eval("#suggestions li", (ns) => ns.map((n) => n.dataset.name));
  await page.press("#prompt", "Enter");
  report.picked = await page.$eval("#prompt", (e) => e.value);
  await page.fill("#prompt", "/");
  await page.dispatchEvent("#prompt", "input");
  report.allSuggested = await page.$$eval("#suggestions li", (ns) => ns.map((n) => n.dataset.name));
  await page.fill("#prompt", "");
  await page.dispatchEvent("#prompt", "input");
  step("commands");

  // An elicitation answered through its form.
  k = await prompt("/elicit");
  await page.waitForSelector("#requests form.elicitation", { timeout: T });
  report.elicitationText = await page.$eval("#requests form.elicitation", (e) => e.textContent);
  report.elicitationLabels = await page.$$eval("#requests form.elicitation label", (ns) => ns.map((n) => n.textContent));
  await page.getByLabel("name (required)").fill("Ada");
  await page.getByLabel("age (required)").fill("36");
  await page.click("#requests form.elicitation button[type=submit]");
  await waitAgent("elicitation: accept", k);
  await idle();
  report.elicitationReply = (await agentTexts())[k];
  report.requestsLeft = await page.$$eval("#requests > *", (ns) => ns.length);
  step("elicitation");

  // Cancel while a turn runs.
  await prompt("/hang");
  await page.waitForSelector("#cancel:not([hidden])", { timeout: T });
  report.activityWhileRunning = await page.$eval("#session-activity", (e) => e.textContent);
  await page.click("#cancel");
  await idle();
  await page.waitForFunction(
    () => [...document.querySelectorAll("#transcript .note")].some((n) => n.textContent === "turn ended: cancelled"),
    null,
    { timeout: T },
  );
  step("cancelled");

  // The Markdown renderer the transcript uses: structure from text, never HTML.
  report.markdown = await page.evaluate(async () => {
    const { renderMarkdown } = await import("/console/markdown.js");
    const div = document.createElement("div");
    div.append(
      renderMarkdown(
        "# Title\n```js\n<b>not bold</b>\n```\n- one\n- **two**\n\n1. first\n\n[ok](https://example.org/x) [bad](javascript:alert(1)) `<i>x</i>` <u>u</u>",
      ),
    );
    return {
      heading: div.querySelector("h3")?.textContent,
      code: div.querySelector("pre code")?.textContent,
      lang: div.querySelector("pre code")?.dataset.lang,
      items: [...div.querySelectorAll("ul li")].map((n) => n.textContent),
      strong: [...div.querySelectorAll("li strong")].map((n) => n.textContent),
      ordered: [...div.querySelectorAll("ol li")].map((n) => n.textContent),
      links: [...div.querySelectorAll("a")].map((a) => [a.textContent, a.getAttribute("href"), a.rel]),
      html: div.querySelectorAll("b, i, u").length,
      last: div.querySelector("p:last-child")?.textContent,
    };
  });
  step("markdown");

  // Rename.
  await page.click("#rename");
  await page.waitForSelector("#confirm[open]", { timeout: T });
  await page.fill("#confirm-input", "Renamed by the console");
  await page.press("#confirm-input", "Enter");
  await page.waitForFunction(
    (sid) =>
      document.getElementById("session-title").textContent === "Renamed by the console" &&
      document.querySelector(`#sessions a[data-session-id="${sid}"] .title`)?.textContent === "Renamed by the console",
    id,
    { timeout: T },
  );
  step("renamed");

  // Archive: gone from the list, back with the archived filter.
  await page.click("#archive");
  await page.waitForFunction(() => document.getElementById("archive").textContent === "Unarchive", null, { timeout: T });
  await page.waitForFunction((sid) => !document.querySelector(`#sessions a[data-session-id="${sid}"]`), id, { timeout: T });
  await page.click("#filter-box summary");
  await page.check("#filter-archived");
  await page.click("#filters button[type=submit]");
  await page.waitForFunction((sid) => !!document.querySelector(`#sessions a[data-session-id="${sid}"]`), id, { timeout: T });
  report.archivedListed = true;
  step("archived");

  // Delete: a confirmation first (cancelled once), then gone.
  await page.click("#delete");
  await page.waitForSelector("#confirm[open]", { timeout: T });
  await page.click("#confirm-cancel");
  report.stillThereAfterCancel = !!(await listed(id));
  await page.click("#delete");
  await page.waitForSelector("#confirm[open]", { timeout: T });
  report.confirmText = await page.$eval("#confirm-text", (e) => e.textContent);
  await page.click("#confirm-ok");
  await page.waitForFunction(() => location.hash === "#/", null, { timeout: T });
  await page.waitForFunction((sid) => !document.querySelector(`#sessions a[data-session-id="${sid}"]`), id, { timeout: T });
  step("deleted");

  // How the transcript shows what the echo agent never sends: thoughts, tool calls with
  // locations and a diff, updated in place. Applied to a view of its own on this page.
  report.rendering = await page.evaluate(async () => {
    const { SessionView } = await import("/console/session.js");
    const v = new SessionView("sess_render", { connection() {}, deleted() {} });
    const t = document.getElementById("transcript");
    t.replaceChildren();
    const u = (update) => ({ sessionId: "sess_render", update });
    v.apply(1, "agent_thought_chunk", u({ sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "<b>hmm</b>" } }));
    v.apply(2, "tool_call", u({ sessionUpdate: "tool_call", toolCallId: "t1", title: "Edit <main.rs>", kind: "edit", status: "pending", locations: [{ path: "/src/main.rs", line: 3 }] }));
    v.apply(3, "tool_call_update", u({ sessionUpdate: "tool_call_update", toolCallId: "t1", status: "completed", content: [{ type: "diff", path: "/src/main.rs", oldText: "a", newText: "b" }] }));
    v.apply(3, "tool_call_update", u({ sessionUpdate: "tool_call_update", toolCallId: "t1", status: "failed" }));
    v.flush();
    v.close();
    const out = {
      thought: t.querySelector("details.thought")?.textContent,
      thoughtOpen: t.querySelector("details.thought")?.open,
      tools: t.querySelectorAll(".tool").length,
      tool: t.querySelector(".tool")?.textContent,
      diff: [...t.querySelectorAll(".tool pre.diff span")].map((s) => `${s.className}:${s.textContent}`),
      html: t.querySelectorAll("b, main").length,
    };
    t.replaceChildren();
    return out;
  });
  step("rendering");

  // Sign out.
  await page.click("#sign-out");
  await page.waitForSelector("#sign-in:not([hidden])", { timeout: T });
  report.keyAfterSignOut = await page.evaluate(() => sessionStorage.getItem("acp-console.key"));
  step("signed-out");
} catch (e) {
  report.error = String(e?.stack || e);
} finally {
  await browser.close();
  console.log(JSON.stringify(report));
  stdin.close();
}
