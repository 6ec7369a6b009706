// A technician's browser as the attacker's way in (tests/e2e/test_browser_attacks.py). Drives
// Debian's chromium (headless, playwright-core):
//   node tests/web/attacker.mjs RIG_URL EVIL_URL
// RIG_URL is the rig (http://127.0.0.1:PORT). EVIL_URL is the attacker's page under a name the
// browser resolves to the attacker's server (--host-resolver-rules: rebind.test -> 127.0.0.3);
// that server answers its page itself and forwards every other path to the rig, which is what a
// DNS rebinding attack achieves once the name points at the rig: the page and the rig are one
// origin to the browser.
// From the attacker's page it tries what a page may: read /api/status and the camera preview
// through the rebound name, open the live view's WebSocket at the rig's own address, show the
// preview cross-site in an <img>. Then, from the rig's own page, the same things must work.
// Prints one JSON line: {"step":"done","attacker":{...},"own":{...}} or {"step":"error",...}.
import { chromium } from "playwright-core";

const [rigUrl, evilUrl] = process.argv.slice(2);
const say = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const evilHost = new URL(evilUrl).hostname;

const FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  `--host-resolver-rules=MAP ${evilHost} 127.0.0.3`,
];

// Runs in a page: what it could read or open. `rig` is the rig's own address (cross-site for the
// attacker's page, same-origin for the rig's own).
async function probe(rig) {
  const out = {};
  const withDeadline = (p, ms) => Promise.race([p, new Promise((r) => setTimeout(() => r("timeout"), ms))]);
  // 1. The status JSON through this page's own origin (the rebound name, or the rig's page).
  try {
    const r = await fetch("/api/status");
    const text = await r.text();
    out.status = { code: r.status, gps: text.includes("\"gps\""), bytes: text.length };
  } catch (e) {
    out.status = { error: String(e) };
  }
  // 2. The camera preview through this page's origin, read as bytes.
  try {
    const r = await fetch("/api/sources/front/preview.jpg");
    const b = new Uint8Array(await r.arrayBuffer());
    out.preview_read = { code: r.status, jpeg: b.length > 2 && b[0] === 0xff && b[1] === 0xd8 };
  } catch (e) {
    out.preview_read = { error: String(e) };
  }
  // 3. The preview shown from the rig's address in an <img> (no CORS needed to display it).
  const img = (src) => withDeadline(new Promise((resolve) => {
    const i = new Image();
    i.onload = () => resolve({ loaded: true, width: i.naturalWidth });
    i.onerror = () => resolve({ loaded: false });
    i.src = src;
  }), 5000);
  out.preview_img = await img(rig + "/api/sources/front/preview.jpg?" + Math.random());
  // 4. The live view: a WebSocket at the rig's address (browsers apply no same-origin rule).
  const ws = rig.replace(/^http/, "ws") + "/foxglove";
  out.live = await withDeadline(new Promise((resolve) => {
    const seen = { opened: false, text: 0, binary: 0, ops: [] };
    let s;
    try {
      s = new WebSocket(ws, ["foxglove.websocket.v1"]);
    } catch (e) {
      resolve({ ...seen, error: String(e) });
      return;
    }
    s.binaryType = "arraybuffer";
    s.onopen = () => { seen.opened = true; };
    s.onmessage = (m) => {
      if (typeof m.data === "string") {
        seen.text += 1;
        try {
          const op = JSON.parse(m.data).op;
          seen.ops.push(op);
          if (op === "advertise") {
            const ch = JSON.parse(m.data).channels.slice(0, 3);
            s.send(JSON.stringify({ op: "subscribe", subscriptions: ch.map((c, i) => ({ id: i + 1, channelId: c.id })) }));
          }
        } catch (_) { /* not JSON */ }
      } else {
        seen.binary += 1;
      }
    };
    s.onerror = () => { seen.error = "error event"; };
    s.onclose = (e) => resolve({ ...seen, closed: e.code });
    setTimeout(() => { try { s.close(); } catch (_) { /* closed */ } resolve(seen); }, 3000);
  }), 6000);
  return out;
}

let browser;
try {
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: FLAGS,
  });
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  await page.goto(evilUrl, { waitUntil: "domcontentloaded" });
  const title = await page.title();
  if (title !== "attacker") throw new Error(`the attacker's page did not load (title ${JSON.stringify(title)})`);
  const attacker = await page.evaluate(probe, rigUrl);

  const own = await ctx.newPage();
  await own.goto(rigUrl + "/", { waitUntil: "domcontentloaded" });
  await own.waitForFunction(() => document.getElementById("conn").textContent === "LIVE", null, { timeout: 15000 });
  const mine = await own.evaluate(probe, rigUrl);
  say({ step: "done", attacker, own: mine });
} catch (e) {
  say({ step: "error", error: String(e && e.stack || e) });
  process.exitCode = 1;
} finally {
  if (browser) await browser.close();
}
