// Timed greedy generation with transformers.js (@huggingface/transformers, Node, onnxruntime-node CPU) from a local
// export dir: the card's speed row of transformers.js (conformance/runtimes/transformersjs.py reads the answer).
//
// stdin: {"export_dir": DIR, "dtypes": ["fp32", "q4", ...], "prompt": [ids...], "new_tokens": N, "rounds": R,
//         "threads": T (0 = onnxruntime-node's default), "node_root": folder whose node_modules holds it}
// stdout: {"versions": {...}, "results": {dtype: {"rounds": [{"t0": ms, "stamps": [ms per new token]}]} | {"error"}}}
// Per dtype: the model is loaded once, one untimed warm-up generate, then R timed ones, each exactly N new tokens
// (min_new_tokens = max_new_tokens: end of sequence ignored). t0 is performance.now() just before generate; a
// streamer stamps each new token as generate hands it over (its first put is the prompt, not stamped).
//
//   echo '{"export_dir":"runs/demo/export","dtypes":["q4"],"prompt":[2,40,41],"new_tokens":8,"rounds":1,"threads":1,"node_root":"node"}' \
//     | node conformance/transformersjs_speed.mjs
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { transformersjsVersions } from './package_versions.mjs';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const require = createRequire(path.join(path.resolve(job.node_root), 'package.json'));
const tjs = await import(pathToFileURL(require.resolve('@huggingface/transformers')).href);
const { AutoModelForCausalLM, env, Tensor } = tjs;
env.allowRemoteModels = false;
env.allowLocalModels = true;
const dir = path.resolve(job.export_dir);
env.localModelPath = path.dirname(dir) + path.sep;

const n = job.prompt.length;
const input_ids = new Tensor('int64', BigInt64Array.from(job.prompt.map(BigInt)), [1, n]);
const attention_mask = new Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]);
const session_options = job.threads ? { intraOpNumThreads: job.threads, interOpNumThreads: 1 } : {};

async function timedRound(model) {
  const stamps = [];
  let prompt = true;
  const streamer = { put() { if (prompt) { prompt = false; return; } stamps.push(performance.now()); }, end() {} };
  const t0 = performance.now();
  await model.generate({ input_ids, attention_mask, max_new_tokens: job.new_tokens, min_new_tokens: job.new_tokens,
    do_sample: false, streamer });
  return { t0, stamps };
}

const results = {};
for (const dtype of job.dtypes) {
  try {
    const model = await AutoModelForCausalLM.from_pretrained(path.basename(dir), { dtype, device: 'cpu', session_options });
    await timedRound(model);  // warm-up, not counted
    const rounds = [];
    for (let r = 0; r < job.rounds; r++) rounds.push(await timedRound(model));
    await model.dispose();
    results[dtype] = { rounds };
  } catch (err) {
    results[dtype] = { error: String(err && err.message ? err.message : err).slice(0, 800) };
  }
}
console.log(JSON.stringify({ versions: transformersjsVersions(job.node_root), results }));
