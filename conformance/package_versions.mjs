// The installed versions of the npm packages a conformance Node script ran, for its answer's "version(s)": read
// from each package's own package.json under NODE_ROOT/node_modules, since their "exports" maps do not expose
// package.json to require or import. Imported by the scripts beside it (the Python package ships every .mjs here).
//
//   node -e "import('./conformance/package_versions.mjs').then((m) => console.log(m.transformersjsVersions('node')))"
import { readFileSync } from 'node:fs';
import path from 'node:path';

// The "version" of NODE_ROOT/node_modules/NAME/package.json, or null where the package is not installed there.
export function packageVersion(nodeRoot, name) {
  try {
    return JSON.parse(readFileSync(path.join(path.resolve(nodeRoot), 'node_modules', name, 'package.json'), 'utf8')).version;
  } catch {
    return null;
  }
}

// What transformers.js ran on under Node: its own version, the onnxruntime-node it loads, and Node's.
export function transformersjsVersions(nodeRoot) {
  return {
    '@huggingface/transformers': packageVersion(nodeRoot, '@huggingface/transformers'),
    'onnxruntime-node': packageVersion(nodeRoot, 'onnxruntime-node'),
    node: process.version,
  };
}
