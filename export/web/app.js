// The export's browser page: transformers.js (web/transformers.min.js) with onnxruntime-web loads the model from
// this folder and generates greedily, streaming. On the WASM device (the default) it loads onnxruntime-web's plain
// WASM build (web/ort-wasm-simd-threaded.{mjs,wasm}): half the bytes of the asyncify build transformers.js picks by
// itself, and faster (bench/browser.py); ?device=webgpu loads the asyncify build (web/ort-wasm-simd-threaded.asyncify.*),
// which WebGPU needs. The default dtype is config.json's transformers.js_config.device_config[device].dtype, else its
// dtype: what transformers.js itself picks for that device.
// URL parameters (used by the browser tests and bench/browser.py): ?dtype=q4&prompt=...&max_new_tokens=16&autorun=1,
// &device=wasm|webgpu, &threads=N (WASM threads; more than 1 needs a cross-origin isolated page), &min_new_tokens=N,
// &wasm=asyncify (the asyncify build on the WASM device too: what the page loaded before, for comparison),
// &q4=fused|fp32 (q4 on WASM through the fused 4-bit kernel, or the q4 file's weights folded to float32, instead of
// the WASM q4 file's 8-bit weights; see q4Path),
// &prompt_ids=1,2,3 (generate from these token ids instead of the prompt text: conformance's browser rows).
// When a run ends, window.prodipResult = {dtype, device, threads, ids (prompt + new), text, load_ms, ttft_ms (generate
// call to first new token), new_tokens, tokens_per_s (after the first new token), bytes, q4_path ('int8-folded',
// 'fp32-folded' or 'fused' for q4 on WASM, else null), stats (the stats line's text), error}.
import { AutoModelForCausalLM, AutoTokenizer, TextStreamer, Tensor, env } from './transformers.min.js';

const params = new URLSearchParams(location.search);
const here = new URL('./', import.meta.url);        // .../web/
const root = new URL('../', here);                  // the export folder
env.allowRemoteModels = false;                      // never the Hugging Face Hub
env.allowLocalModels = true;                        // false by default in a browser
env.localModelPath = root.pathname;
const DEVICE = params.get('device') || 'wasm';
const build = DEVICE === 'wasm' && params.get('wasm') !== 'asyncify' ? '' : '.asyncify';
env.backends.onnx.wasm.wasmPaths = {                // from this folder, not the CDN
  mjs: new URL(`ort-wasm-simd-threaded${build}.mjs`, here).href,
  wasm: new URL(`ort-wasm-simd-threaded${build}.wasm`, here).href,
};
const MODEL = '.';                                  // the export folder itself

const $ = (id) => document.getElementById(id);
const bytes = () => performance.getEntriesByType('resource')
  .reduce((n, e) => n + (e.encodedBodySize || e.transferSize || 0), 0);
performance.setResourceTimingBufferSize(10000);

const config = await (await fetch(new URL('config.json', root))).json();
const tjs = config['transformers.js_config'] || {};
const FILES = { fp32: 'model', fp16: 'model_fp16', q8: 'model_quantized', q4: 'model_q4' };
// the dtypes whose file this export has: asked of the server (HEAD), since a file may hold its weights inline
// and then is not named in use_external_data_format
const present = await Promise.all(Object.values(FILES).map(async (f) =>
  (await fetch(new URL(`onnx/${f}.onnx`, root), { method: 'HEAD' }).catch(() => ({ ok: false }))).ok));
const offered = Object.keys(FILES).filter((_, i) => present[i]);
const deviceDtype = (tjs.device_config || {})[DEVICE]?.dtype || tjs.dtype;   // as transformers.js resolves it
for (const d of offered) $('dtype').add(new Option(d + (d === deviceDtype ? ' (default)' : ''), d));
$('dtype').value = params.get('dtype') || deviceDtype || offered[0];
if (params.has('prompt')) $('prompt').value = params.get('prompt');
if (params.has('max_new_tokens')) $('tokens').value = params.get('max_new_tokens');
if (params.has('threads')) env.backends.onnx.wasm.numThreads = Number(params.get('threads'));

// q4 on the WASM device. The q4 file is int4 DequantizeLinear + MatMul (QDQ). onnxruntime-web's WASM build has no
// 4-bit kernel: by default its QDQ fusion makes MatMulNBits, which dequantises the weights on every call (q4 then
// decodes ~6x slower than fp32). So the page loads, when the export has it (transformers.js_config.prodip_wasm_q4),
// the WASM q4 file: a graph over the same int4 bytes (onnx/model_q4.onnx_data) that requantises each weight to the
// q8 file's uint8 MatMulInteger layout; with session.disable_quant_qdq=1 those weight-side nodes fold once at load
// ('int8-folded': a 4-bit download, 8-bit weights in memory, the q8 file's kernels). Without that file, the q4 file's
// weights fold to float32 ('fp32-folded': fp32's speed, fp32's memory) when they fit comfortably in wasm32's 4 GB
// address space (FP32_LIMIT), else the fused path stays (slow, but 4-bit in memory). ?q4=fused|fp32 forces one of
// the other paths (for comparison: bench/browser.py).
const FP32_LIMIT = 1.5e9;   // bytes of float32 weights; leaves room for the 4-bit file, activations and KV cache
const WASM_Q4 = tjs.prodip_wasm_q4;   // {model_file_name, external_data: [{path, data}], session_config}
function parameterCount(c) {  // decoder weights from config.json (HF LlamaConfig names)
  const h = c.hidden_size, hd = c.head_dim || h / c.num_attention_heads;
  const kv = c.num_key_value_heads || c.num_attention_heads;
  const layer = h * hd * (2 * c.num_attention_heads + 2 * kv) + 3 * h * c.intermediate_size + 2 * h;
  return c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + c.num_hidden_layers * layer + h;
}
function q4Path(dtype) {
  if (dtype !== 'q4' || DEVICE !== 'wasm') return null;
  const fp32 = 4 * parameterCount(config), asked = params.get('q4');
  if (asked === 'fused') return { path: 'fused', fp32_bytes: fp32, why: '?q4=fused' };
  if (WASM_Q4 && asked !== 'fp32') return { path: 'int8-folded', fp32_bytes: fp32, why: `${WASM_Q4.model_file_name}_q4.onnx` };
  if (asked === 'fp32') return { path: 'fp32-folded', fp32_bytes: fp32, why: '?q4=fp32' };
  return fp32 < FP32_LIMIT ? { path: 'fp32-folded', fp32_bytes: fp32, why: `fp32 weights ${(fp32 / 1e9).toFixed(2)} GB` }
    : { path: 'fused', fp32_bytes: fp32, why: `fp32 weights ${(fp32 / 1e9).toFixed(2)} GB would not fit` };
}

let loaded = { dtype: null, model: null, tokenizer: null, load_ms: 0, q4: null };
async function load(dtype) {
  if (loaded.dtype === dtype) return loaded;
  const t0 = performance.now();
  const tokenizer = await AutoTokenizer.from_pretrained(MODEL);
  const q4 = q4Path(dtype);
  const options = { dtype, device: DEVICE };
  // transformers.js passes session_options to onnxruntime-web's InferenceSession.create
  if (q4?.path === 'fp32-folded') options.session_options = { extra: { session: { disable_quant_qdq: '1' } } };
  if (q4?.path === 'int8-folded') {   // the WASM q4 file, reading the q4 file's weights (no second download)
    options.model_file_name = WASM_Q4.model_file_name;
    const session = Object.fromEntries(Object.entries(WASM_Q4.session_config).map(([k, v]) => [k.replace(/^session\./, ''), v]));
    options.session_options = { extra: { session }, externalData: WASM_Q4.external_data };
  }
  const model = await AutoModelForCausalLM.from_pretrained(MODEL, options);
  loaded = { dtype, model, tokenizer, load_ms: performance.now() - t0, q4 };
  return loaded;
}

async function run() {
  const dtype = $('dtype').value || params.get('dtype');   // a ?dtype the export lacks selects nothing: say so
  $('go').disabled = true;
  $('out').textContent = '';
  const result = { dtype, device: DEVICE, wasm_build: `ort-wasm-simd-threaded${build}`, threads: env.backends.onnx.wasm.numThreads ?? null, ids: null, text: '', load_ms: null,
    ttft_ms: null, new_tokens: null, tokens_per_s: null, bytes: null, q4_path: null, error: null };
  try {
    if (!offered.includes(dtype)) throw new Error(`this export has no ${dtype} file (it has: ${offered.join(', ')})`);
    $('stats').textContent = `loading ${dtype}…`;
    const { model, tokenizer, load_ms, q4 } = await load(dtype);
    result.load_ms = load_ms;
    result.q4_path = q4 ? q4.path : null;
    if (DEVICE === 'webgpu' && navigator.gpu) {                     // which adapter ran it (SwiftShader in CI)
      const info = (await navigator.gpu.requestAdapter())?.info || {};
      result.adapter = { vendor: info.vendor, architecture: info.architecture };
    }
    const ids = params.get('prompt_ids')?.split(',').map(BigInt);
    const inputs = ids ? { input_ids: new Tensor('int64', BigInt64Array.from(ids), [1, ids.length]),
      attention_mask: new Tensor('int64', new BigInt64Array(ids.length).fill(1n), [1, ids.length]) }
      : tokenizer($('prompt').value);
    let first = null, n = 0;
    const streamer = new TextStreamer(tokenizer, {
      skip_prompt: true,
      callback_function: (text) => { $('out').textContent += text; result.text += text; },
      token_callback_function: () => { n += 1; first ??= performance.now(); },
    });
    const t0 = performance.now();
    const out = await model.generate({ ...inputs, max_new_tokens: Number($('tokens').value),
      min_new_tokens: Number(params.get('min_new_tokens') || 0), do_sample: false, streamer });
    const t1 = performance.now();
    result.ttft_ms = first - t0;
    result.new_tokens = n;
    result.ids = Array.from(out.data, Number);
    // decode speed after the first new token (the prompt's prefill is in load-to-first-token)
    result.tokens_per_s = n > 1 ? (n - 1) / ((t1 - first) / 1000) : null;
  } catch (err) {
    result.error = String(err && err.message ? err.message : err);
    $('out').textContent = 'error: ' + result.error;
  }
  result.bytes = bytes();
  const q4 = loaded.dtype === dtype ? loaded.q4 : null;
  const path = q4 ? (q4.path === 'fp32-folded' ? ' (4-bit download, dequantised to fp32 at load: ' + q4.why + ')'
    : q4.path === 'int8-folded' ? ' (4-bit download, requantised to 8-bit at load: ' + q4.why + ')'
    : ' (4-bit kernel in WASM, slow: ' + q4.why + ')') : '';
  $('stats').textContent = `dtype ${dtype}${path} · load ${(result.load_ms ?? 0).toFixed(0)} ms · ` +
    `${result.tokens_per_s ? result.tokens_per_s.toFixed(1) : '–'} tokens/s · ` +
    `${(result.bytes / 1e6).toFixed(1)} MB downloaded`;
  result.stats = $('stats').textContent;
  $('go').disabled = false;
  window.prodipResult = result;
}

$('go').textContent = 'Generate';
$('go').disabled = false;
$('go').onclick = run;
if (params.get('autorun') === '1') run();
