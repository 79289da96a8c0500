// The one Chromium driver: open pages one after another in one headless system Chromium (puppeteer-core: no
// browser download), each in a fresh tab, and collect each page's result object (window[result]). Used through
// prodip.conformance.runtimes.browser_page.open_pages by conformance's browser rows, tests/browser and
// bench/browser.py.
//
// stdin: {"jobs": [{"url": URL, "result": "prodipResult", "timeout_ms": 600000,
//                   "actions": [["type", "#prompt", "text"], ["click", "#go"]] (optional, before waiting;
//                              kinds: type, click, select (a <select>'s value), wait_text (until the element's
//                              text is the given text)),
//                   "steps": [[action, ...], ...] (optional: after the load, per step clear window[result], run
//                            its actions and wait for window[result] again, the page staying open: a model loaded
//                            once, generated several times),
//                   "screenshot": PATH (optional: written when the page fails or times out)}, ...],
//         "node_root": DIR (whose node_modules holds puppeteer-core), "chromium": "/usr/bin/chromium",
//         "args": [extra Chromium flags] (default ["--disable-gpu"]; WebGPU: ["--enable-unsafe-webgpu"])}
// stdout: one JSON line per job, as it finishes:
//         {"url": URL, "result": {...} | null, "error": str | null, "console": [lines], "requests": [urls],
//          "steps": [{"result": {...} | null, "error": str | null}, ...] (with "steps": each step's answer; a
//          failed step does not stop the next)}
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const require = createRequire(path.join(path.resolve(job.node_root || path.dirname(new URL(import.meta.url).pathname)), 'package.json'));
const puppeteer = (await import(pathToFileURL(require.resolve('puppeteer-core')).href)).default;
const profile = mkdtempSync(path.join(tmpdir(), 'prodip-chromium-'));
const browser = await puppeteer.launch({
  executablePath: job.chromium || '/usr/bin/chromium',
  headless: true,
  protocolTimeout: 0,  // a page may compute for minutes (a large model on one thread): its own timeout_ms bounds it
  args: ['--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', `--user-data-dir=${profile}`, ...(job.args || ['--disable-gpu'])],
});
async function act(page, actions, timeout) {
  for (const [kind, selector, value] of actions) {
    if (kind === 'type') await page.type(selector, value);
    else if (kind === 'click') await page.click(selector);
    else if (kind === 'select') await page.select(selector, value);
    else if (kind === 'wait_text') {
      await page.waitForFunction((sel, text) => document.querySelector(sel)?.textContent === text,
        { timeout, polling: 50 }, selector, value);
    } else throw new Error(`unknown page action ${kind}`);
  }
}
async function answer(page, name, timeout) {
  await page.waitForFunction((n) => window[n] !== undefined, { timeout, polling: 50 }, name);
  return page.evaluate((n) => window[n], name);
}
try {
  for (const one of job.jobs) {
    const out = { url: one.url, result: null, error: null, console: [], requests: [] };
    const page = await browser.newPage();
    page.on('console', (m) => out.console.push(`${m.type()}: ${m.text()}`.slice(0, 500)));
    page.on('pageerror', (e) => out.console.push(`pageerror: ${e.message}`.slice(0, 500)));
    page.on('request', (r) => out.requests.push(r.url()));
    try {
      await page.goto(one.url, { waitUntil: 'load', timeout: one.timeout_ms });
      await act(page, one.actions || [], one.timeout_ms);
      if (one.steps) {
        out.steps = [];
        for (const step of one.steps) {
          try {
            await page.evaluate((name) => { window[name] = undefined; }, one.result);
            await act(page, step, one.timeout_ms);
            const result = await answer(page, one.result, one.timeout_ms);
            out.steps.push({ result, error: (result && result.error) || null });
          } catch (err) {
            out.steps.push({ result: null, error: String(err && err.message ? err.message : err) });
          }
        }
      } else {
        out.result = await answer(page, one.result, one.timeout_ms);
        if (out.result && out.result.error) out.error = out.result.error;
      }
    } catch (err) {
      out.error = String(err && err.message ? err.message : err);
    }
    if (out.error && one.screenshot) await page.screenshot({ path: one.screenshot, fullPage: true }).catch(() => {});
    out.console = out.console.slice(-20);
    await page.close();
    console.log(JSON.stringify(out));
  }
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
