// Tokenize texts with the Node runtimes, for prodip's tokenizer parity check (tokenizer/parity.py).
//
//   node node/tokenize.mjs REQUEST.json RESPONSE.json
//
// REQUEST: {"tokenizer_dir": DIR, "gguf": FILE or null, "texts": [string, ...], "runtimes": ["transformers.js", "llama.cpp"]}
// RESPONSE: {"ids": {runtime: [[int, ...], ...]}, "versions": {runtime: string}, "errors": {runtime: string},
//            "llama.cpp": {"bos": int|null, "add_bos": bool}}
// Each runtime's default encode of a prompt: transformers.js AutoTokenizer.encode(text) (its post-processor
// adds <|bos|>); llama.cpp: the BOS the GGUF asks for (tokenizer.ggml.add_bos_token) followed by
// llama_tokenize(text, parse_special = true), as llama.cpp's own tools build a prompt.
import fs from "node:fs";
import path from "node:path";

const pkgVersion = (name) =>
  JSON.parse(fs.readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url), "utf8")).version;

async function transformersJs(dir, texts) {
  const {AutoTokenizer, env} = await import("@huggingface/transformers");
  env.allowRemoteModels = false;
  env.localModelPath = path.dirname(path.resolve(dir));
  const tok = await AutoTokenizer.from_pretrained(path.basename(path.resolve(dir)), {local_files_only: true});
  return {ids: texts.map((t) => Array.from(tok.encode(t))), version: pkgVersion("@huggingface/transformers")};
}

async function llamaCpp(ggufPath, texts, out) {
  const {getLlama} = await import("node-llama-cpp");
  const llama = await getLlama({gpu: false, build: "never", logLevel: "error", logger: () => {}});
  try {
    const model = await llama.loadModel({modelPath: ggufPath, vocabOnly: true});
    const addBos = model.tokens.shouldPrependBosToken && model.tokens.bos != null;
    out["llama.cpp"] = {bos: model.tokens.bos, add_bos: addBos};
    const prefix = addBos ? [model.tokens.bos] : [];
    const ids = texts.map((t) => prefix.concat(Array.from(model.tokenize(t, true))));
    await model.dispose();
    return {ids, version: `llama.cpp ${llama.llamaCppRelease.release} (node-llama-cpp ${pkgVersion("node-llama-cpp")})`};
  } finally {
    await llama.dispose();
  }
}

const [requestPath, responsePath] = process.argv.slice(2);
const req = JSON.parse(fs.readFileSync(requestPath, "utf8"));
const res = {ids: {}, versions: {}, errors: {}};
const runners = {
  "transformers.js": () => transformersJs(req.tokenizer_dir, req.texts),
  "llama.cpp": () => llamaCpp(req.gguf, req.texts, res),
};
for (const name of req.runtimes) {
  try {
    const {ids, version} = await runners[name]();
    res.ids[name] = ids;
    res.versions[name] = version;
  } catch (err) {
    res.errors[name] = String(err && err.stack || err).slice(0, 2000);
  }
}
fs.writeFileSync(responsePath, JSON.stringify(res));
