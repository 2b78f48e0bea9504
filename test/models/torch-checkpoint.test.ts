// PyTorch checkpoints (pytorch_model.bin, sharded with pytorch_model.bin.index.json; PEFT's adapter_model.bin) read in
// place: a state dict written by Python's pickle and zipfile in torch.save's layout (test/fixtures/torch-save/make.py)
// gives its tensors by hand, and a tiny model converted to .bin by that script (from its own safetensors) loads to the
// same weights and generates the same tokens as from the safetensors.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { LLM } from "../../src/engine/llm-engine.js";
import { ModelFormatError } from "../../src/models/formats/model-format-error.js";
import { readTorchCheckpoint } from "../../src/models/formats/torch-checkpoint.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { inspectModelDir } from "../../src/models/model-dir.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const fixtures = fileURLToPath(new URL("../../../test/fixtures/torch-save/", import.meta.url));
const python = spawnSync("python3", ["--version"]).status === 0;

describe("PyTorch checkpoints", () => {
  it("a state dict's tensors: names, dtypes, shapes and values (a tied copy and a view at an offset too; non-tensors skipped)", () => {
    const h = readTorchCheckpoint(path.join(fixtures, "state-dict.bin"));
    assert.deepEqual(h.tensors.map((t) => [t.name, t.dtype, t.shape]), [
      ["a.weight", "F32", [2, 3]], ["a.bias", "F32", [2]], ["b.weight", "BF16", [2, 2]], ["tied.weight", "F32", [2, 3]], ["c.weight", "F32", [2]],
    ]);
    assert.deepEqual([...h.loadAsFloat32("a.weight")], [1, 2, 3, 4, 5, 6]);
    assert.deepEqual([...h.loadAsFloat32("a.bias")], [-1, -2]);
    assert.deepEqual([...h.loadAsFloat32("b.weight")], [0.5, -0.25, 2, 8]);
    assert.deepEqual([...h.loadAsFloat32("tied.weight")], [1, 2, 3, 4, 5, 6]);
    assert.deepEqual([...h.loadAsFloat32("c.weight")], [12, 13]);
    assert.equal(h.has("step"), false);
  });

  it("refused with the file named: a non-contiguous view, a file that is no checkpoint", () => {
    assert.throws(() => readTorchCheckpoint(path.join(fixtures, "state-dict-transposed.bin")),
      (e) => e instanceof ModelFormatError && /state-dict-transposed\.bin \(t\.weight\): a non-contiguous view \(size \[3, 2\], stride \[1, 3\]\)/.test(e.message));
    const junk = tempPath("junk-pytorch_model.bin");
    fs.writeFileSync(junk, "not a zip");
    assert.throws(() => readTorchCheckpoint(junk), /\[pytorch\] .*junk-pytorch_model\.bin: no zip directory/);
    fs.writeFileSync(junk, Buffer.from([0x80, 0x02, 0x8a]));
    assert.throws(() => readTorchCheckpoint(junk), /legacy \(pre-1\.6, non-zip\) torch\.save format/);
  });

  /** A copy of the tiny Llama's directory with its weights as PyTorch .bin file(s) written by the Python script. */
  const binCopy = (name: string, shards: number): string => {
    const src = tinyModelDir("LlamaForCausalLM");
    const dir = tempPath(name);
    fs.rmSync(dir, { recursive: true, force: true });
    fs.cpSync(src, dir, { recursive: true });
    const r = spawnSync("python3", [path.join(fixtures, "make.py"), "convert", dir, String(shards)], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    fs.rmSync(path.join(dir, "model.safetensors"));
    return dir;
  };

  it("a model from pytorch_model.bin, and from two shards with their index, equals the safetensors model", { skip: python ? false : "python3 is not installed" }, () => {
    const ref = loadLocalModel(tinyModelDir("LlamaForCausalLM"));
    for (const [name, shards] of [["bin-one", 1], ["bin-sharded", 2]] as const) {
      const dir = binCopy(name, shards);
      assert.equal(inspectModelDir(dir).weights?.format, "pt");
      const m = loadLocalModel(dir);
      for (const [n, t] of ref.model.namedParameters()) assert.deepEqual(m.model.getParameter(n)!.toList(), t.toList(), `${name}: ${n}`);
    }
    const ids = [5, 17, 29, 41, 53, 65, 77];
    const greedy = (model: string) => new LLM({ model, maxModelLen: 64 }).generate([{ promptTokenIds: ids }], { temperature: 0, maxTokens: 6, ignoreEos: true })[0]!.outputs[0]!.tokenIds;
    assert.deepEqual(greedy(binCopy("bin-generate", 1)), greedy(tinyModelDir("LlamaForCausalLM")));
    assert.throws(() => loadLocalModel(binCopy("bin-format", 1), { loadFormat: "safetensors" }), /load_format "safetensors" was asked, but the model's weights are pt/);
  });
});

describe("PEFT adapters saved as adapter_model.bin", () => {
  it("serve as the same adapter saved as safetensors", { skip: python ? false : "python3 is not installed" }, async () => {
    const { allProjections, writeLoraAdapter } = await import("../helpers/lora-adapter.js");
    const model = tinyModelDir("LlamaForCausalLM");
    const st = writeLoraAdapter(model, tempPath("lora-st"), { rank: 4, alpha: 8, modules: allProjections(2).slice(0, 5), seed: 11 });
    const bin = tempPath("lora-bin");
    fs.rmSync(bin, { recursive: true, force: true });
    fs.cpSync(st, bin, { recursive: true });
    const r = spawnSync("python3", [path.join(fixtures, "make.py"), "convert", bin, "1", "adapter_model.safetensors", "adapter_model.bin"], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    fs.rmSync(path.join(bin, "adapter_model.safetensors"));
    const llm = new LLM({ model, maxModelLen: 64, enableLora: true, maxLoraRank: 8 });
    const run = (p: string, id: number) =>
      llm.generate([{ promptTokenIds: [3, 14, 15, 92, 65] }], { temperature: 0, maxTokens: 6, ignoreEos: true }, { loraRequest: { name: `a${id}`, id, path: p } })[0]!.outputs[0]!.tokenIds;
    const base = llm.generate([{ promptTokenIds: [3, 14, 15, 92, 65] }], { temperature: 0, maxTokens: 6, ignoreEos: true })[0]!.outputs[0]!.tokenIds;
    const a = run(st, 1);
    assert.deepEqual(run(bin, 2), a);
    assert.notDeepEqual(a, base, "the adapter changes the output");
  });
});
