// llama.cpp (node-llama-cpp's prebuilt CPU build) as a conformance runner: logits of token ids, per sequence.
//
//   node node/llamacpp_eval.mjs MODEL.gguf SEQUENCES CONTEXT THREADS
//
// Reads one JSON request per stdin line, writes one JSON response per stdout line:
//   {"op": "info"}                          -> {"n_vocab", "bos", "eos", "eot", "add_bos", "train_context", "version"}
//   {"op": "eval", "seq": i, "tokens": [..], "reset": bool}
//       -> {"logits": base64 float32 (len(tokens) x n_vocab), row-major}; the tokens are appended to sequence i
//          (after clearing it when reset) and every one gets its next-token logits (llama.cpp's raw logits:
//          no sampling options are applied).
//   {"op": "tokenize", "texts": [..]}       -> {"ids": [[..], ..]} (BOS per the GGUF's add_bos_token, then
//          llama_tokenize(text, parse_special = true), as llama.cpp's own tools build a prompt)
// The KV cache is float32 and flash attention off, so a float32 GGUF computes what PyTorch computes.
import fs from "node:fs";
import readline from "node:readline";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

// batch: tokens one eval may hold (the longest sequence; default the whole context)
const [modelPath, nSeq, ctxSize, threads, batch] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {}});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const ctx = await model.createContext({
  contextSize: Number(ctxSize), sequences: Number(nSeq), threads: Number(threads), batchSize: Number(batch ?? ctxSize),
  flashAttention: false, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const seqs = Array.from({length: Number(nSeq)}, () => ctx.getSequence());
const V = model.fileInfo.metadata.llama?.vocab_size ?? model.fileInfo.metadata.tokenizer.ggml.tokens.length;
const version = JSON.parse(fs.readFileSync(new URL("./node_modules/node-llama-cpp/package.json", import.meta.url))).version;
const llamaCppRelease = JSON.parse(
  fs.readFileSync(new URL("./node_modules/node-llama-cpp/llama/binariesGithubRelease.json", import.meta.url))).release;

async function handle(req) {
  if (req.op === "info") {
    const meta = model.fileInfo.metadata;
    return {n_vocab: V, bos: model.tokens.bos, eos: model.tokens.eos, eot: model.tokens.eot ?? null,
            add_bos: model.tokens.shouldPrependBosToken, train_context: model.trainContextSize,
            rope_theta: meta.llama?.rope?.freq_base ?? null, pre: meta.tokenizer?.ggml?.pre ?? null,
            version: `node-llama-cpp ${version}, llama.cpp ${llamaCppRelease}`};
  }
  if (req.op === "tokenize") {
    const ids = req.texts.map((t) => {
      const body = Array.from(model.tokenize(t, true));
      return model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos, ...body] : body;
    });
    return {ids};
  }
  if (req.op === "eval") {
    const seq = seqs[req.seq];
    if (req.reset) await seq.clearHistory();
    const res = await seq.controlledEvaluate(req.tokens.map((t) => [t, {generateNext: {logits: true}}]));
    const out = new Float32Array(req.tokens.length * V);
    res.forEach((r, i) => { for (const [tok, logit] of r.next.logits) out[i * V + tok] = logit; });
    return {logits: Buffer.from(out.buffer).toString("base64")};
  }
  throw new Error(`unknown op ${req.op}`);
}

const rl = readline.createInterface({input: process.stdin});
for await (const line of rl) {
  let reply;
  try { reply = await handle(JSON.parse(line)); } catch (err) { reply = {error: String(err?.stack ?? err)}; }
  process.stdout.write(JSON.stringify(reply) + "\n");
}
await ctx.dispose(); await model.dispose(); await llama.dispose();
