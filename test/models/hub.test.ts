import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { resolveModel, ModelNotFoundError, cachedSnapshotDir } from "../../src/models/hub.js";
import { inspectModelDir } from "../../src/models/model-dir.js";
import { writeSafetensors, writeSafetensorsIndex } from "../../src/models/formats/safetensors.js";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-hub-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));

test("resolveModel: local dir and .gguf file as is", async () => {
  const dir = path.join(tmp, "local");
  fs.mkdirSync(dir);
  assert.deepEqual(await resolveModel(dir), { path: dir, kind: "dir", source: "local" });
  const g = path.join(tmp, "m.gguf");
  fs.writeFileSync(g, "");
  assert.deepEqual(await resolveModel(g), { path: g, kind: "gguf", source: "local" });
  await assert.rejects(resolveModel(path.join(tmp, "missing")), ModelNotFoundError);
});

test("resolveModel: HF cache layout via refs, offline miss names the path", async () => {
  const cache = path.join(tmp, "hub");
  const commit = "a".repeat(40);
  const repo = path.join(cache, "models--org--name");
  fs.mkdirSync(path.join(repo, "refs"), { recursive: true });
  fs.writeFileSync(path.join(repo, "refs", "main"), commit + "\n");
  const snap = path.join(repo, "snapshots", commit);
  fs.mkdirSync(snap, { recursive: true });
  fs.writeFileSync(path.join(snap, "config.json"), "{}");
  assert.equal(cachedSnapshotDir("org/name", "main", cache), snap);
  assert.deepEqual(await resolveModel("org/name", { cacheDir: cache }), { path: snap, kind: "dir", source: "cache" });
  await assert.rejects(resolveModel("org/other", { cacheDir: cache, offline: true }), (e: unknown) => {
    return e instanceof ModelNotFoundError && /not cached/.test(e.message) && e.message.includes(path.join(cache, "models--org--other", "snapshots", "main"));
  });
});

test("inspectModelDir finds config, sharded weights, tokenizer files", () => {
  const dir = path.join(tmp, "model");
  fs.mkdirSync(dir);
  for (const f of ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]) fs.writeFileSync(path.join(dir, f), "{}");
  writeSafetensors(path.join(dir, "model-00001-of-00002.safetensors"), [{ name: "a", dtype: "U8", shape: [1], data: new Uint8Array(1) }]);
  writeSafetensors(path.join(dir, "model-00002-of-00002.safetensors"), [{ name: "b", dtype: "U8", shape: [1], data: new Uint8Array(1) }]);
  writeSafetensorsIndex(dir, { a: "model-00001-of-00002.safetensors", b: "model-00002-of-00002.safetensors" }, 2);
  const info = inspectModelDir(dir);
  assert.equal(info.configPath, path.join(dir, "config.json"));
  assert.equal(info.generationConfigPath, path.join(dir, "generation_config.json"));
  assert.equal(info.chatTemplatePath, path.join(dir, "chat_template.jinja"));
  assert.equal(info.specialTokensMapPath, null);
  assert.deepEqual(info.weights, {
    format: "safetensors", indexPath: path.join(dir, "model.safetensors.index.json"),
    files: [path.join(dir, "model-00001-of-00002.safetensors"), path.join(dir, "model-00002-of-00002.safetensors")],
  });
  const g = path.join(tmp, "x.gguf");
  fs.writeFileSync(g, "");
  assert.deepEqual(inspectModelDir(g).weights, { format: "gguf", files: [g] });
});
