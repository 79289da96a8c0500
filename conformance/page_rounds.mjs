// Time the export's own web page in one headless system Chromium (puppeteer-core), one tab for every dtype: the
// page is opened without autorun; per dtype its dtype menu is set and its Generate button pressed once (the model
// loads and generates: the warm-up, not counted), then `rounds` more times, reading window.prodipResult after each
// (the page times itself with performance.now: ttft_ms from the generate call to the first new token, tokens_per_s
// after the first token). One tab keeps onnxruntime-web's WASM compiled once for all dtypes, and the model stays
// loaded between presses, as for a user pressing Generate again. Used by prodip.conformance.web_page.
//
// stdin: {"url": URL (no autorun), "dtypes": ["q8", ...], "rounds": R, "timeout_ms": 600000, "node_root": DIR,
//         "chromium": "/usr/bin/chromium", "args": [extra Chromium flags]}
// stdout: {"url", "results": {dtype: {"rounds": [result, ...]} | {"error": str}}, "error": str | null, "console": [lines]}
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
const press = async (page, dtype, timeout) => {
  await page.evaluate((d) => {
    window.prodipResult = undefined;
    document.getElementById('dtype').value = d;
    document.getElementById('go').click();
  }, dtype);
  await page.waitForFunction(() => window.prodipResult !== undefined, { timeout, polling: 50 });
  const res = await page.evaluate(() => window.prodipResult);
  if (res.error) throw new Error(res.error);
  return res;
};
const out = { url: job.url, results: {}, error: null, console: [] };
const page = await browser.newPage();
page.on('console', (m) => out.console.push(`${m.type()}: ${m.text()}`.slice(0, 500)));
page.on('pageerror', (e) => out.console.push(`pageerror: ${e.message}`.slice(0, 500)));
try {
  await page.goto(job.url, { waitUntil: 'load', timeout: job.timeout_ms });
  await page.waitForFunction(() => document.getElementById('go')?.textContent === 'Generate', { timeout: job.timeout_ms, polling: 50 });
  for (const dtype of job.dtypes) {
    try {
      await press(page, dtype, job.timeout_ms);  // load + warm-up, not counted
      const rounds = [];
      for (let r = 0; r < job.rounds; r++) rounds.push(await press(page, dtype, job.timeout_ms));
      out.results[dtype] = { rounds };
    } catch (err) {
      out.results[dtype] = { error: String(err && err.message ? err.message : err) };
    }
  }
} catch (err) {
  out.error = String(err && err.message ? err.message : err);
}
out.console = out.console.slice(-20);
await page.close();
console.log(JSON.stringify(out));
await browser.close();
rmSync(profile, { recursive: true, force: true });
