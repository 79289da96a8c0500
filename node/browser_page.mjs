// Open one page in the system's Chromium (puppeteer-core: no browser download) and wait for the page's
// result object. Used by tests/browser: the export's page (window.prodipResult) and serve's playground
// (window.playgroundResult).
//
// stdin: {"url": URL, "node_root": DIR, "result": "prodipResult", "chromium": "/usr/bin/chromium", "timeout_ms": 120000,
//         "screenshot": PATH (written when the page fails or times out), "actions": [["click", "#go"], ...]}
// stdout: {"result": {...} | null, "error": str | null, "console": [lines], "requests": [urls]}
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString('utf8'));
// node_root: the folder whose node_modules holds puppeteer-core (default: this script's folder, node/)
const require = createRequire(path.join(path.resolve(job.node_root || path.dirname(new URL(import.meta.url).pathname)), 'package.json'));
const puppeteer = (await import(pathToFileURL(require.resolve('puppeteer-core')).href)).default;
const profile = mkdtempSync(path.join(tmpdir(), 'prodip-chromium-'));
const browser = await puppeteer.launch({
  executablePath: job.chromium || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', `--user-data-dir=${profile}`],
});
const out = { result: null, error: null, console: [], requests: [] };
const page = await browser.newPage();
page.on('console', (m) => out.console.push(`${m.type()}: ${m.text()}`.slice(0, 500)));
page.on('pageerror', (e) => out.console.push(`pageerror: ${e.message}`.slice(0, 500)));
page.on('request', (r) => out.requests.push(r.url()));
try {
  await page.goto(job.url, { waitUntil: 'load', timeout: job.timeout_ms });
  for (const [kind, selector, value] of job.actions || []) {
    if (kind === 'type') await page.type(selector, value);
    if (kind === 'click') await page.click(selector);
  }
  await page.waitForFunction((name) => window[name] !== undefined, { timeout: job.timeout_ms, polling: 200 }, job.result);
  out.result = await page.evaluate((name) => window[name], job.result);
  if (out.result && out.result.error) out.error = out.result.error;
} catch (err) {
  out.error = String(err && err.message ? err.message : err);
}
if (out.error && job.screenshot) await page.screenshot({ path: job.screenshot, fullPage: true }).catch(() => {});
await browser.close();
rmSync(profile, { recursive: true, force: true });
console.log(JSON.stringify(out));
