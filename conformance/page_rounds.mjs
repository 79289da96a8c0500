// Time the export's own web page in one headless system Chromium (puppeteer-core): for each job, open the page once
// (its autorun loads the model and generates: the warm-up, not counted), then press its Generate button `rounds`
// times, reading window.prodipResult after each (the page times itself with performance.now: ttft_ms from the
// generate call to the first new token, tokens_per_s after the first token). The model stays loaded between
// presses, as for a user pressing Generate again. Used by prodip.conformance.web_page (the card's speed table).
//
// stdin: {"jobs": [{"url": URL (with &autorun=1), "rounds": R, "timeout_ms": 600000}, ...], "node_root": DIR,
//         "chromium": "/usr/bin/chromium", "args": [extra Chromium flags]}
// stdout: one JSON line per job: {"url", "warmup": result, "rounds": [result, ...], "error": str | null, "console": [lines]}
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const require = createRequire(path.join(path.resolve(job.node_root), 'package.json'));
const puppeteer = (await import(pathToFileURL(require.resolve('puppeteer-core')).href)).default;
const profile = mkdtempSync(path.join(tmpdir(), 'prodip-chromium-'));
const browser = await puppeteer.launch({
  executablePath: job.chromium || '/usr/bin/chromium',
  headless: true,
  protocolTimeout: 0,
  args: ['--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', `--user-data-dir=${profile}`, ...(job.args || ['--disable-gpu'])],
});
const waitResult = async (page, timeout) => {
  await page.waitForFunction(() => window.prodipResult !== undefined, { timeout, polling: 50 });
  return page.evaluate(() => window.prodipResult);
};
for (const one of job.jobs) {
  const out = { url: one.url, warmup: null, rounds: [], error: null, console: [] };
  const page = await browser.newPage();
  page.on('console', (m) => out.console.push(`${m.type()}: ${m.text()}`.slice(0, 500)));
  page.on('pageerror', (e) => out.console.push(`pageerror: ${e.message}`.slice(0, 500)));
  try {
    await page.goto(one.url, { waitUntil: 'load', timeout: one.timeout_ms });
    out.warmup = await waitResult(page, one.timeout_ms);
    if (out.warmup.error) throw new Error(out.warmup.error);
    for (let r = 0; r < one.rounds; r++) {
      await page.evaluate(() => { window.prodipResult = undefined; document.getElementById('go').click(); });
      const res = await waitResult(page, one.timeout_ms);
      if (res.error) throw new Error(res.error);
      out.rounds.push(res);
    }
  } catch (err) {
    out.error = String(err && err.message ? err.message : err);
  }
  out.console = out.console.slice(-20);
  await page.close();
  console.log(JSON.stringify(out));
}
await browser.close();
rmSync(profile, { recursive: true, force: true });
