// Writes a real engine-level logits processor module (plain .mjs, as a user would) for the tests that load
// processors by specifier: in-process, in the engine worker and through `kiln serve --logits-processors`.
import * as fs from "node:fs";
import * as path from "node:path";
import { tempPath } from "../helpers/tiny-model.js";

const SOURCE = `// Bans token extraArgs.ban_token for the requests that ask for it; records its per-request hooks.
export class BanToken {
  constructor({ vocabSize }) {
    this.vocabSize = vocabSize;
    this.added = [];
    this.removed = [];
  }
  validateParams(params) {
    const t = params.extraArgs?.ban_token;
    if (t !== undefined && !(Number.isInteger(t) && t >= 0 && t < this.vocabSize)) throw new Error("ban_token must be a token id");
  }
  addRequest(row) {
    this.added.push(row.requestId);
  }
  removeRequest(requestId) {
    this.removed.push(requestId);
  }
  apply(logits, rows, vocabSize) {
    rows.forEach((row, r) => {
      const t = row.extraArgs.ban_token;
      if (typeof t === "number") logits[r * vocabSize + t] = -Infinity;
    });
  }
}
export default BanToken;
export const notAProcessor = 42;
export class Throws {
  constructor() {
    throw new Error("no GPU here");
  }
  apply() {}
}
`;

/** Writes ban-token.mjs (plus a broken sibling, broken.mjs) into a fresh temp directory; returns ban-token.mjs's path. */
export function writeBanTokenProcessor(name = "procs"): string {
  const dir = tempPath(name);
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, "ban-token.mjs");
  fs.writeFileSync(file, SOURCE);
  fs.writeFileSync(path.join(dir, "broken.mjs"), "export default class {\n");
  return file;
}
