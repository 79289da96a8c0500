// onnxruntime-web's WASM build in Node: next-token logits of an ONNX decoder (prodip's KV-cache contract), one token
// per call with the cache, over given token windows (teacher forcing). The same WASM kernels the export's page runs
// in a browser (the plain build, ort.wasm.min.mjs; "build": "ort.webgpu.min.mjs" for the asyncify one).
//
// stdin: {"model": PATH, "windows": [[ids], ...], "layers": L, "kv_heads": H, "head_dim": D, "threads": 1,
//         "out": PATH (float32 little-endian logits, [windows][tokens][vocab]), "node_root": DIR, "build": "ort.wasm.min.mjs"}
// stdout: {"vocab": V, "positions": N}
import { readFileSync, existsSync, openSync, writeSync, closeSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const job = JSON.parse(readFileSync(0, 'utf8'));
const root = job.node_root || path.dirname(new URL(import.meta.url).pathname);
const ort = await import(pathToFileURL(path.join(root, 'node_modules/onnxruntime-web/dist', job.build || 'ort.wasm.min.mjs')).href);
ort.env.wasm.numThreads = job.threads || 1;
const opts = { executionProviders: ['wasm'] };
if (existsSync(job.model + '_data')) opts.externalData = [{ path: path.basename(job.model) + '_data', data: readFileSync(job.model + '_data') }];
const session = await ort.InferenceSession.create(readFileSync(job.model), opts);
const fd = openSync(job.out, 'w');
let vocab = 0, positions = 0;
for (const ids of job.windows) {
  let past = {};
  for (let l = 0; l < job.layers; l++) for (const kv of ['key', 'value'])
    past[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [1, job.kv_heads, 0, job.head_dim]);
  for (let t = 0; t < ids.length; t++) {
    const r = await session.run({
      input_ids: new ort.Tensor('int64', BigInt64Array.from([BigInt(ids[t])]), [1, 1]),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(t + 1).fill(1n), [1, t + 1]),
      position_ids: new ort.Tensor('int64', BigInt64Array.from([BigInt(t)]), [1, 1]),
      ...past,
    });
    vocab = r.logits.dims[2];
    const row = r.logits.data;
    writeSync(fd, Buffer.from(row.buffer, row.byteOffset, row.byteLength));
    positions += 1;
    past = {};
    for (let l = 0; l < job.layers; l++) for (const kv of ['key', 'value']) past[`past_key_values.${l}.${kv}`] = r[`present.${l}.${kv}`];
  }
}
closeSync(fd);
console.log(JSON.stringify({ vocab, positions }));
