// Drives Debian's chromium (headless, through playwright-core) against a running rigd and checks
// what a technician sees. Run by tests/e2e/test_web.py:
//   node tests/web/browser.mjs URL ARTIFACT_DIR
// Prints one JSON object per line: {"step": ..., ...}. After the live checks it prints
// {"step":"ready-for-outage"} and waits for a line on stdin (the test stops rigd), then checks that
// the page shows itself as stale. Exits 1 with {"step":"error"} on any failure.
import { chromium } from "playwright-core";
import { join } from "node:path";
import { createInterface } from "node:readline";

const [url, outDir] = process.argv.slice(2);
const say = (o) => process.stdout.write(JSON.stringify(o) + "\n");

// The flags the machine notes ask for: no sandbox as root, no GPU, and no background network
// traffic (this machine's network is closed; Chromium would otherwise retry lookups at every start).
const FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

function stdinLine() {
  const rl = createInterface({ input: process.stdin });
  return new Promise((resolve) => rl.once("line", (l) => { rl.close(); resolve(l); }));
}

async function check(page, sources) {
  await page.goto(url, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => document.getElementById("conn").textContent === "LIVE", null, { timeout: 15000 });
  const clock = await page.textContent("#clock-state");
  if (!["UNSYNCED", "LOCKING", "LOCKED", "HOLDOVER"].includes(clock)) throw new Error(`clock card shows ${clock}`);
  const frames = async (id) => Number((await page.textContent(`[data-source="${id}"] .frames`)).replace(/[^0-9]/g, ""));
  const before = {};
  for (const s of sources) before[s.id] = await frames(s.id);
  await page.waitForTimeout(2500);
  const moving = {};
  for (const s of sources) moving[s.id] = [before[s.id], await frames(s.id)];
  const badges = {};
  for (const s of sources) badges[s.id] = await page.textContent(`[data-source="${s.id}"] .badge`);
  const thumbs = {};
  for (const s of sources.filter((s) => s.modality === "camera" && s.state === "running")) {
    const sel = `[data-source="${s.id}"] img.thumb`;
    await page.waitForFunction((sel) => { const i = document.querySelector(sel); return i && i.complete && i.naturalWidth > 0; }, sel, { timeout: 10000 });
    thumbs[s.id] = await page.$eval(sel, (i) => [i.naturalWidth, i.naturalHeight]);
  }
  const levels = {};
  for (const s of sources.filter((s) => s.modality === "audio" && s.state === "running")) {
    levels[s.id] = await page.textContent(`[data-source="${s.id}"] .level`);
  }
  const records = {};
  for (const s of sources.filter((s) => s.modality === "serial")) {
    records[s.id] = await page.textContent(`[data-source="${s.id}"] pre.records`);
  }
  const alerts = await page.$$eval("#alerts li", (lis) => lis.map((l) => [l.className, l.textContent]));
  return { clock, moving, badges, thumbs, levels, records, alerts };
}

let browser;
try {
  const status = await (await fetch(url + "/api/status")).json();
  const sources = status.sources;
  // launch() starts chromium on a fresh temporary --user-data-dir of its own and removes it after.
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: FLAGS,
  });
  const shots = [
    ["laptop", { viewport: { width: 1366, height: 768 } }],
    ["phone", { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true }],
  ];
  const pages = {};
  for (const [name, opts] of shots) {
    const ctx = await browser.newContext({ ...opts, deviceScaleFactor: 1 });
    const page = await ctx.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    const seen = await check(page, sources);
    if (errors.length) throw new Error(`${name}: page errors: ${errors.join("; ")}`);
    // Let the thumbnail and meter settle on the latest update before the picture.
    await page.waitForTimeout(1200);
    const path = join(outDir, `web-${name}.png`);
    await page.screenshot({ path, fullPage: name === "phone" });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    say({ step: "checked", layout: name, screenshot: path, horizontal_overflow_px: overflow, ...seen });
    pages[name] = page;
  }

  // A technician action through the page: token, note, "Mark event".
  if (process.env.RIGD_TOKEN) {
    const page = pages.laptop;
    await page.click("#actions summary");
    await page.fill("#token", process.env.RIGD_TOKEN);
    await page.fill("#note", "marked from the page");
    await page.click("#mark");
    await page.waitForFunction(() => document.getElementById("action-result").textContent.startsWith("Done"), null, { timeout: 10000 });
    const result = await page.textContent("#action-result");
    await page.waitForFunction(() => document.querySelector("#conn").textContent === "LIVE");
    say({ step: "action", result });
  }

  // The outage: the test stops rigd; the page must say that what it shows is stale.
  say({ step: "ready-for-outage" });
  await stdinLine();
  const page = pages.laptop;
  await page.waitForFunction(() => document.getElementById("conn").textContent === "STALE", null, { timeout: 10000 });
  const banner = await page.isVisible("#stale-banner");
  const path = join(outDir, "web-laptop-stale.png");
  await page.screenshot({ path });
  say({ step: "stale", banner, screenshot: path });
  say({ step: "done" });
} catch (e) {
  say({ step: "error", error: String(e && e.stack || e) });
  process.exitCode = 1;
} finally {
  if (browser) await browser.close().catch(() => {});
}
