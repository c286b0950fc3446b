// Validates Argo Rollouts manifests (a JSON array on stdin) with @kubernetes-models/argo-rollouts' own validators,
// installed under the folder given as the first argument; prints one list of errors per manifest (empty: valid).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const models = `${process.argv[2]}/node_modules/@kubernetes-models/argo-rollouts/argoproj.io/v1alpha1/`;
const manifests = JSON.parse(readFileSync(0, "utf8"));
const results = [];
for (const manifest of manifests) {
  let module;
  try {
    module = await import(pathToFileURL(`${models}${manifest.kind}.js`).href);
  } catch {
    results.push([`no model of kind ${manifest.kind} in argoproj.io/v1alpha1`]);
    continue;
  }
  try {
    new module[manifest.kind](manifest).validate();
    results.push([]);
  } catch (error) {
    results.push((error.errors ?? [error]).map((e) => e.instancePath !== undefined ? `${e.instancePath} ${e.message}` : String(e.message)));
  }
}
process.stdout.write(JSON.stringify(results));
