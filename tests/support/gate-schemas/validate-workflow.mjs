// Validates GitHub Actions workflows (a JSON array of their YAML texts on stdin) with @action-validator/core, which
// checks each against SchemaStore's workflow schema, installed under the folder given as the first argument; prints
// one list of errors per workflow (empty: valid).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(`${process.argv[2]}/`);
const { validateWorkflow } = require("@action-validator/core");
const results = JSON.parse(readFileSync(0, "utf8")).map((source) =>
  validateWorkflow(source).errors.map((e) => [e.path ?? "", e.title, e.detail ?? ""].filter(Boolean).join(": ")));
process.stdout.write(JSON.stringify(results));
