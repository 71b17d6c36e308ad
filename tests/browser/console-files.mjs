// The console's Files panel, for tests/browser/files.rs: a session made through the create form
// as a git worktree of REPO; its tree walked into `src/` and a file opened and downloaded; a file
// dropped on the panel (a real drop event carrying a File), after which the script prints
// `DROPPED <session id>` and waits for the test's `CHECKED`; two turns that write files, the
// tree refreshed by their `workspace_changed` without a click; the last turn's changes and all
// the changes; revert to the older turn's checkpoint, then to the base, each confirmed in the
// dialog. The last stdout line is the JSON report.
import { createInterface } from "node:readline";
import { readFile } from "node:fs/promises";
import { T, launch } from "./chromium.mjs";

const base = process.env.GATEWAY_URL.replace(/\/$/, "");
const stdin = createInterface({ input: process.stdin });
const lines = stdin[Symbol.asyncIterator]();
const report = { steps: [], consoleErrors: [], pageErrors: [] };

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  page.on("console", (m) => m.type() === "error" && report.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => report.pageErrors.push(String(e)));
  const listed = () => page.$$eval("#files-list li[data-path]", (lis) => lis.map((li) => li.dataset.path));
  const changes = () =>
    page.$$eval("#files-diff section.change", (s) => s.map((n) => [n.dataset.path, n.dataset.status]));
  const waitListed = (path, present = true) =>
    page.waitForFunction(
      ([p, want]) => !!document.querySelector(`#files-list li[data-path="${p}"]`) === want,
      [path, present],
      { timeout: T },
    );
  // The diff shown names exactly `paths` (sorted), or says nothing changed.
  const waitChanges = (paths) =>
    page.waitForFunction(
      (want) => {
        const got = [...document.querySelectorAll("#files-diff section.change")].map((n) => n.dataset.path);
        const empty = !!document.querySelector("#files-diff p.muted");
        return want.length ? JSON.stringify(got) === JSON.stringify(want) : empty && got.length === 0;
      },
      paths,
      { timeout: T },
    );
  // A turn that writes `path`: the tree shows it (the stream's `workspace_changed`, told
  // before the turn's end), then the turn ends.
  const writes = async (path) => {
    await page.fill("#prompt", `/write ${path}`);
    await page.press("#prompt", "Enter");
    await waitListed(path);
    await page.waitForFunction(() => document.getElementById("cancel").hidden, null, { timeout: T });
  };
  const revertTo = async (value) => {
    await page.selectOption("#files-revert-to", value);
    await page.click("#files-revert");
    await page.waitForSelector("#confirm[open]", { timeout: T });
    await page.click("#confirm-ok");
  };

  await page.goto(`${base}/`);
  await page.waitForSelector("#app:not([hidden])", { timeout: T });
  await page.selectOption("#create-workspace", "worktree");
  await page.fill("#create-cwd", process.env.REPO);
  await page.click("#create-submit");
  await page.waitForFunction(() => location.hash.startsWith("#/s/"), null, { timeout: T });
  const id = decodeURIComponent((await page.evaluate(() => location.hash)).slice(4));
  await page.waitForSelector("#files-box:not([hidden])", { timeout: T });
  report.summary = await page.textContent("#files-summary");
  await page.click("#files-box summary");
  await waitListed("README.md");
  report.root = await listed();
  step("tree");

  await page.click('#files-list li[data-path="src"] button');
  await waitListed("src/lib.rs");
  report.src = await listed();
  await page.click('#files-list li[data-path="src/lib.rs"] button');
  await page.waitForSelector("#files-view:not([hidden])", { timeout: T });
  report.shown = { path: await page.textContent("#files-path"), text: await page.textContent("#files-text") };
  const [download] = await Promise.all([page.waitForEvent("download", { timeout: T }), page.click("#files-download")]);
  report.download = { name: download.suggestedFilename(), text: await readFile(await download.path(), "utf8") };
  await page.click('#files-crumbs button[data-path=""]');
  await waitListed("README.md");
  step("file");

  // A drop as a browser makes it: a DataTransfer holding a File, dropped on the panel.
  await page.evaluate(() => {
    const dt = new DataTransfer();
    dt.items.add(new File(["dropped by drag\n"], "dropped.txt", { type: "text/plain" }));
    const zone = document.getElementById("files-drop");
    for (const type of ["dragenter", "dragover", "drop"]) {
      zone.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
    }
  });
  await waitListed("dropped.txt");
  report.uploadStatus = await page.textContent("#files-status");
  console.log(`DROPPED ${id}`);
  if ((await lines.next()).value !== "CHECKED") throw new Error("the test did not check the upload");
  step("drop");

  // The agent's writes reach the tree through the session's stream, with no click.
  await writes("notes.txt");
  await writes("b.txt");
  step("turns");

  await page.click("#files-last-tab");
  await waitChanges(["b.txt"]);
  report.last = await changes();
  report.lastPatch = await page.textContent("#files-diff pre.diff");
  await page.click("#files-all-tab");
  await waitChanges(["b.txt", "dropped.txt", "notes.txt"]);
  report.all = await changes();
  step("changes");

  // Newest first: the second turn's checkpoint, the first's, the base.
  const options = await page.$$eval("#files-revert-to option", (os) => os.map((o) => o.value));
  report.revertChoices = options.length;
  await revertTo(options[1]);
  await waitChanges(["dropped.txt", "notes.txt"]);
  report.afterRevert = await changes();
  await revertTo("base");
  await waitChanges([]);
  await page.click("#files-tree-tab");
  await waitListed("notes.txt", false);
  report.afterBase = await listed();
  step("revert");
} catch (e) {
  report.error = String(e?.stack || e);
} finally {
  await browser.close();
  stdin.close();
  console.log(JSON.stringify(report));
}

function step(name) {
  report.steps.push(name);
}
