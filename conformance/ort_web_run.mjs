// Run any ONNX model once on onnxruntime-web's plain WASM build in Node (1 thread): the kernels the export's page runs.
// stdin: {"model": PATH, "inputs": {name: {"dtype": "float32"|"int64", "dims": [...], "path": RAW_FILE}},
//         "outputs": {name: RAW_FILE}, "node_root": DIR}   (raw files: little-endian, C order)
// stdout: {name: {"dtype": ..., "dims": [...]}} for each output written
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const job = JSON.parse(readFileSync(0, 'utf8'));
const root = job.node_root || path.dirname(new URL(import.meta.url).pathname);
const ort = await import(pathToFileURL(path.join(root, 'node_modules/onnxruntime-web/dist/ort.wasm.min.mjs')).href);
ort.env.wasm.numThreads = 1;
const opts = { executionProviders: ['wasm'] };
if (existsSync(job.model + '_data')) opts.externalData = [{ path: path.basename(job.model) + '_data', data: readFileSync(job.model + '_data') }];
const session = await ort.InferenceSession.create(readFileSync(job.model), opts);
const ARRAYS = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array, uint8: Uint8Array, int8: Int8Array };
const feeds = {};
for (const [name, spec] of Object.entries(job.inputs)) {
  const buf = readFileSync(spec.path);
  const Arr = ARRAYS[spec.dtype];
  feeds[name] = new ort.Tensor(spec.dtype, new Arr(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength)), spec.dims);
}
const res = await session.run(feeds, Object.keys(job.outputs));
const out = {};
for (const [name, file] of Object.entries(job.outputs)) {
  const t = res[name];
  writeFileSync(file, Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  out[name] = { dtype: t.type, dims: t.dims };
}
console.log(JSON.stringify(out));
