// `kiln train`'s exit statuses: a recipe the run cannot take is a usage error (2, as a bad flag), named in the message.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/train -> package root

describe("kiln train command line", () => {
  it("exits 2 naming the value for a bad recipe value, unknown key, missing recipe, missing or empty dataset or one too small for a step", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-train-cli-"));
    try {
      const recipe = path.join(dir, "r.toml");
      fs.writeFileSync(recipe, `[job]\ndump_folder = "${path.join(dir, "run")}"\n[model]\ndim = 32\nn_layers = 1\nn_heads = 2\nmax_seq_len = 32\ntokenizer_vocab_size = 300\n[training]\nlocal_batch_size = 2\nseq_len = 16\nsteps = 1\n`);
      fs.mkdirSync(path.join(dir, "empty"));
      fs.writeFileSync(path.join(dir, "tiny.txt"), "Too little text.\n");
      const cases: [string[], RegExp][] = [
        [["--set", "training.steps=abc"], /\[training\] steps: expected an integer, got "abc"/],
        [["--training.stepz", "3"], /unknown key "stepz" in \[training\]/],
        [["--set", "training.global_batch_size=3"], /global_batch_size 3 is not a multiple of local_batch_size 2/],
        [["--set", `training.dataset=${path.join(dir, "missing.jsonl")}`], /\[training\] dataset \S+missing\.jsonl does not exist/],
        [["--set", `training.dataset=${path.join(dir, "missing.txt")}`], /\[training\] dataset \S+missing\.txt does not exist/],
        [["--set", `training.dataset=${path.join(dir, "empty")}`], /\[training\] dataset \S+empty: corpus path \S+empty holds no text files/],
        [["--set", `training.dataset=${path.join(dir, "tiny.txt")}`], /\[training\] dataset \S+tiny\.txt: \d+ tokens give \d+ windows? of 16\+1, fewer than one step's 2/],
      ];
      for (const [args, message] of cases) {
        const r = spawnSync(`${root}/bin/kiln`, ["train", "--config", recipe, "--no-resume", ...args], { encoding: "utf8", timeout: 60_000 });
        assert.equal(r.status, 2, `${args.join(" ")}: ${r.stderr}`);
        assert.match(r.stderr, message);
        assert.doesNotMatch(r.stderr, /ENOENT/);
      }
      const r = spawnSync(`${root}/bin/kiln`, ["train", "--config", path.join(dir, "none.toml")], { encoding: "utf8", timeout: 60_000 });
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, /cannot read config \S+none\.toml/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
