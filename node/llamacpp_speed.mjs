// Timed greedy generation with llama.cpp (node-llama-cpp's prebuilt CPU build): the card's speed row of llama.cpp
// (conformance/runtimes/llamacpp.py reads the answer).
//
// stdin: {"files": [GGUF paths], "prompt": [ids...], "new_tokens": N, "rounds": R, "threads": T (0 = 1)}
// stdout: {"version": "node-llama-cpp X, llama.cpp bY", "results": {file: {"rounds": [{"t0": ms, "stamps": [ms]}]} | {"error"}}}
// Per file: one context, one untimed warm-up round, then R timed ones; each round clears the sequence, then
// evaluates the prompt and takes exactly N tokens greedily (temperature 0; the generator does not stop at end of
// sequence). t0 is performance.now() before the prompt is evaluated; each token is stamped as the generator yields it.
//
//   echo '{"files":["runs/demo/export/gguf/model-q8_0.gguf"],"prompt":[2,40,41],"new_tokens":8,"rounds":1,"threads":1}' \
//     | node node/llamacpp_speed.mjs
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const version = JSON.parse(fs.readFileSync(new URL("./node_modules/node-llama-cpp/package.json", import.meta.url))).version;
const release = JSON.parse(
  fs.readFileSync(new URL("./node_modules/node-llama-cpp/llama/binariesGithubRelease.json", import.meta.url))).release;
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {}});

async function timedRound(seq) {
  await seq.clearHistory();
  const stamps = [];
  const t0 = performance.now();
  for await (const _tok of seq.evaluate(job.prompt, {temperature: 0})) {
    stamps.push(performance.now());
    if (stamps.length >= job.new_tokens) break;
  }
  return {t0, stamps};
}

const results = {};
for (const file of job.files) {
  try {
    const model = await llama.loadModel({modelPath: file, gpuLayers: 0});
    const ctx = await model.createContext({
      contextSize: job.prompt.length + job.new_tokens + 8, sequences: 1, threads: job.threads || 1,
    });
    const seq = ctx.getSequence();
    await timedRound(seq);  // warm-up, not counted
    const rounds = [];
    for (let r = 0; r < job.rounds; r++) rounds.push(await timedRound(seq));
    await ctx.dispose(); await model.dispose();
    results[file] = {rounds};
  } catch (err) {
    results[file] = {error: String(err?.message ?? err).slice(0, 800)};
  }
}
await llama.dispose();
console.log(JSON.stringify({version: `node-llama-cpp ${version}, llama.cpp ${release}`, results}));
