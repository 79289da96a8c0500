// Greedy generation with transformers.js (@huggingface/transformers, Node, onnxruntime-node CPU) from a
// local export dir: what conformance/runtimes/transformersjs.py compares with ONNX Runtime on the same ONNX file.
//
// stdin: {"export_dir": DIR, "dtypes": ["fp32", "q4", ...], "prompts": [[ids...], ...], "max_new_tokens": N,
//         "node_root": folder whose node_modules holds @huggingface/transformers}
// stdout: {"versions": {...}, "results": {dtype: {"ids": [[prompt + generated ids], ...]} | {"error": "..."}}}
// Generation stops at the export's eos_token_id (generation_config.json) or after N new tokens.
//
//   echo '{"export_dir":"runs/demo/export","dtypes":["q4"],"prompts":[[2,40,41]],"max_new_tokens":8,"node_root":"."}' \
//     | node conformance/transformersjs_greedy.mjs
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { transformersjsVersions } from './package_versions.mjs';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const require = createRequire(path.join(path.resolve(job.node_root), 'package.json'));
const entry = require.resolve('@huggingface/transformers');
const tjs = await import(pathToFileURL(entry).href);
const { AutoModelForCausalLM, env, Tensor } = tjs;
env.allowRemoteModels = false;
env.allowLocalModels = true;
const dir = path.resolve(job.export_dir);
env.localModelPath = path.dirname(dir) + path.sep;

const results = {};
for (const dtype of job.dtypes) {
  try {
    const model = await AutoModelForCausalLM.from_pretrained(path.basename(dir), { dtype, device: 'cpu' });
    const ids = [];
    for (const prompt of job.prompts) {
      const n = prompt.length;
      const input_ids = new Tensor('int64', BigInt64Array.from(prompt.map(BigInt)), [1, n]);
      const attention_mask = new Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]);
      const out = await model.generate({ input_ids, attention_mask, max_new_tokens: job.max_new_tokens, do_sample: false });
      ids.push(Array.from(out.data, Number));
    }
    await model.dispose();
    results[dtype] = { ids };
  } catch (err) {
    results[dtype] = { error: String(err && err.message ? err.message : err).slice(0, 800) };
  }
}
console.log(JSON.stringify({ versions: transformersjsVersions(job.node_root), results }));
