// llama.cpp (node-llama-cpp's prebuilt CPU build) decode speed: greedy tokens after a prompt, S sequences at once.
//
//   node node/llamacpp_decode.mjs MODEL.gguf SEQUENCES THREADS TOKENS PROMPT_IDS_JSON ROUNDS
//
// One context with SEQUENCES sequences (llama.cpp batches their steps together), each fed the same prompt
// (token ids) and decoding TOKENS tokens greedily (temperature 0, no repetition penalty, EOS ignored by
// taking exactly TOKENS tokens). Prints one JSON line per round: {"rate": aggregate decode tokens/s after the
// first token of every sequence (prefill excluded), "tokens": [per sequence]}.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, nSeq, threads, nTok, promptJson, rounds] = process.argv.slice(2);
const S = Number(nSeq), N = Number(nTok), prompt = JSON.parse(promptJson);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {}});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const ctx = await model.createContext({
  contextSize: (prompt.length + N + 8) * S, sequences: S, threads: Number(threads), batchSize: 512,
});
const seqs = Array.from({length: S}, () => ctx.getSequence());

async function one(seq, stamps) {
  let n = 0;
  for await (const _tok of seq.evaluate(prompt, {temperature: 0})) {
    stamps.push(performance.now());
    if (++n >= N) break;
  }
}

for (let r = 0; r < Number(rounds); r++) {
  await Promise.all(seqs.map((s) => s.clearHistory()));
  const stamps = seqs.map(() => []);
  await Promise.all(seqs.map((s, i) => one(s, stamps[i])));
  const first = Math.max(...stamps.map((t) => t[0])), last = Math.max(...stamps.map((t) => t[t.length - 1]));
  const decoded = stamps.reduce((a, t) => a + t.length - 1, 0);
  process.stdout.write(JSON.stringify({rate: decoded / ((last - first) / 1000), tokens: stamps.map((t) => t.length)}) + "\n");
}
await ctx.dispose(); await model.dispose(); await llama.dispose();
