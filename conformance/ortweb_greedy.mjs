// Greedy generation with onnxruntime-web's WASM backend under Node: the build transformers.js loads in a
// browser (`onnxruntime-web/webgpu`, whose WASM binary also runs its `wasm` device), from the npm package,
// on the export's ONNX files. What conformance/runtimes/ortweb.py compares with ONNX Runtime on the same file.
//
// stdin: {"export_dir": DIR, "files": ["onnx/model.onnx", ...], "prompts": [[ids...], ...], "max_new_tokens": N,
//         "stop_ids": [ids that end generation], "num_layers": L, "num_kv_heads": KV, "head_dim": D, "node_root": DIR,
//         "options": {file: {"session": {config entry without "session.": value}, "external_data": [[name, path]]}}}
//         (options optional: default no session entries and the file's own <file>_data)
// stdout: {"versions": {...}, "results": {file: {"ids": [[prompt + new ids]], "logits": [[[last-row logits per step]]]}
//                                              | {"error": "..."}}}
// A file that the build cannot load (an operator without a WASM kernel) gives ONNX Runtime's error, which names
// the operator ("Could not find an implementation for GatherBlockQuantized(1) node with name ...").
//
//   echo '{"export_dir":"runs/demo/export","files":["onnx/model_q4.onnx"],"prompts":[[1,40,41]],"max_new_tokens":8,
//          "stop_ids":[2],"num_layers":4,"num_kv_heads":4,"head_dim":64,"node_root":"node"}' | node conformance/ortweb_greedy.mjs
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { packageVersion } from './package_versions.mjs';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const pkg = path.join(path.resolve(job.node_root), 'node_modules', 'onnxruntime-web');
// transformers.js's web build imports 'onnxruntime-web/webgpu' (dist/ort.webgpu.bundle.min.mjs); the unbundled
// twin loads the same ort-wasm-simd-threaded.asyncify.wasm from dist/ beside it
const ort = await import(pathToFileURL(path.join(pkg, 'dist', 'ort.webgpu.min.mjs')).href);
ort.env.wasm.numThreads = 1;
ort.env.logLevel = 'error';

const dir = path.resolve(job.export_dir);
const results = {};
for (const file of job.files) {
  try {
    const full = path.join(dir, file);
    const opts = { executionProviders: ['wasm'], graphOptimizationLevel: 'all' };
    const own = (job.options || {})[file] || {};   // a file's session config entries and external data files
    if (own.session) opts.extra = { session: own.session };
    if (own.external_data) opts.externalData = own.external_data.map(([p, rel]) => ({ path: p, data: readFileSync(path.join(dir, rel)) }));
    else if (existsSync(full + '_data')) opts.externalData = [{ path: path.basename(full) + '_data', data: readFileSync(full + '_data') }];
    const session = await ort.InferenceSession.create(readFileSync(full), opts);
    const ids = [], logits = [];
    for (const prompt of job.prompts) {
      const seq = prompt.map(Number), steps = [];
      let past = {};
      for (let l = 0; l < job.num_layers; l++) for (const kv of ['key', 'value'])
        past[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [1, job.num_kv_heads, 0, job.head_dim]);
      let fresh = seq.slice();
      for (let step = 0; step < job.max_new_tokens; step++) {
        const n = fresh.length, total = seq.length;
        const feeds = {
          input_ids: new ort.Tensor('int64', BigInt64Array.from(fresh.map(BigInt)), [1, n]),
          attention_mask: new ort.Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]),
          position_ids: new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(total - n + i)), [1, n]),
          ...past,
        };
        for (const name of Object.keys(feeds)) if (!session.inputNames.includes(name)) delete feeds[name];
        const out = await session.run(feeds);
        const v = out.logits.dims[2], row = out.logits.data.slice((n - 1) * v, n * v);
        steps.push(Array.from(row));
        let best = 0;
        for (let j = 1; j < v; j++) if (row[j] > row[best]) best = j; // first maximum, as numpy's argmax
        seq.push(best);
        past = {};
        for (let l = 0; l < job.num_layers; l++) for (const kv of ['key', 'value'])
          past[`past_key_values.${l}.${kv}`] = out[`present.${l}.${kv}`];
        fresh = [best];
        if ((job.stop_ids || []).includes(best)) break;
      }
      ids.push(seq);
      logits.push(steps);
    }
    await session.release();
    results[file] = { ids, logits };
  } catch (err) {
    results[file] = { error: String(err && err.message ? err.message : err).slice(0, 800) };
  }
}
const version = (name) => packageVersion(job.node_root, name);
console.log(JSON.stringify({ versions: { 'onnxruntime-web': version('onnxruntime-web'), backend: 'wasm (ort.webgpu build)', node: process.version }, results }));
