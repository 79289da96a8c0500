// The chat contract in the Node runtimes: each renders the fixed conversations with its own template engine
// from its own artifact and tokenizes the result; what conformance/runtimes/transformersjs.py and llamacpp.py return to conformance/chat.py.
//
// stdin: {"export_dir": DIR, "conversations": [[{role, content}, ...], ...], "transformersjs": bool,
//         "gguf": FILE or null, "end_of_turn_id": int, "stop_ids": [int] (the export's stop set),
//         "node_root": folder whose node_modules holds the packages}
// stdout: {"transformers.js": {"ids": [[...], ...], "version"} | {"error"},
//          "llama.cpp": {"ids": [[...], ...], "template": str, "end_of_turn_is_eog": bool,
//                        "stop_ids": [the ids of stop_ids llama.cpp ends generation at], "version"} | {"error"}}
// transformers.js: AutoTokenizer.from_pretrained(export dir).apply_chat_template(messages, {add_generation_prompt:
//   true}) (tokenizer_config.json's chat_template, @huggingface/jinja). llama.cpp: the GGUF's tokenizer.chat_template,
//   read by node-llama-cpp and rendered with @huggingface/jinja (the engine node-llama-cpp's JinjaTemplateChatWrapper
//   uses; bos_token and eos_token are the GGUF's token texts), then llama_tokenize(text, parse_special = true) with
//   no BOS added (the template writes it); the end of turn
//   is llama.cpp's own verdict, llama_vocab_is_eog (model.isEogToken).
//
//   echo '{"export_dir":"runs/demo/export","conversations":[[{"role":"user","content":"hi"}]],"transformersjs":true,
//          "gguf":null,"end_of_turn_id":4,"node_root":"node"}' | node conformance/chat_template.mjs
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { packageVersion } from './package_versions.mjs';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const root = path.resolve(job.node_root);
const require = createRequire(path.join(root, 'package.json'));
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);
const version = (name) => packageVersion(root, name);
const message = (err) => String(err && err.message ? err.message : err).slice(0, 800);
const out = {};

if (job.transformersjs) {
  try {
    const { AutoTokenizer, env } = await load('@huggingface/transformers');
    env.allowRemoteModels = false;
    env.allowLocalModels = true;
    const dir = path.resolve(job.export_dir);
    env.localModelPath = path.dirname(dir) + path.sep;
    const tok = await AutoTokenizer.from_pretrained(path.basename(dir), { local_files_only: true });
    const ids = job.conversations.map((messages) => {
      const r = tok.apply_chat_template(messages, { add_generation_prompt: true, tokenize: true, return_tensor: false });
      return Array.from(r.input_ids ?? r, Number); // 4.x returns {input_ids, attention_mask}
    });
    out['transformers.js'] = { ids, version: `@huggingface/transformers ${version('@huggingface/transformers')}` };
  } catch (err) {
    out['transformers.js'] = { error: message(err) };
  }
}

if (job.gguf) {
  try {
    const { getLlama, LlamaLogLevel } = await load('node-llama-cpp');
    const { Template } = await load('@huggingface/jinja');
    const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, logger: () => {} });
    const model = await llama.loadModel({ modelPath: job.gguf, vocabOnly: true });
    const template = model.fileInfo.metadata.tokenizer?.chat_template ?? null;
    if (template == null) throw new Error(`${job.gguf}: no tokenizer.chat_template`);
    const engine = new Template(template);
    // the special-token texts a template may read (an imported model's, e.g. Llama 3's {{ bos_token }}),
    // from the GGUF's own vocabulary, as llama.cpp's server passes them
    const specials = { bos_token: model.tokens.bosString ?? '', eos_token: model.tokens.eosString ?? '' };
    const ids = job.conversations.map((messages) =>
      Array.from(model.tokenize(engine.render({ messages, add_generation_prompt: true, ...specials }), true), Number));
    out['llama.cpp'] = {
      ids, template, end_of_turn_is_eog: model.isEogToken(job.end_of_turn_id),
      stop_ids: (job.stop_ids ?? []).filter((id) => model.isEogToken(id)),
      version: `llama.cpp ${llama.llamaCppRelease.release} (node-llama-cpp ${version('node-llama-cpp')}, @huggingface/jinja ${version('@huggingface/jinja')})`,
    };
    await model.dispose();
    await llama.dispose();
  } catch (err) {
    out['llama.cpp'] = { error: message(err) };
  }
}
console.log(JSON.stringify(out));
