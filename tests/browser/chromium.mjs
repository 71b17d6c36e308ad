// What every browser script shares: Debian's chromium (CHROMIUM overrides the path), headless,
// driven by playwright-core, and the bound on any one wait.
import { chromium } from "playwright-core";

export const T = 30_000;

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox"],
  });
}
