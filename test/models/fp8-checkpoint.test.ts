// FP8 checkpoints (vLLM's quant_method "fp8" and compressed-tensors fp8): the e4m3 codes load into the fp8
// kernel as they are, with per-tensor or per-channel scales, and the model computes what a float32 checkpoint
// holding the dequantized weights (code * scale, decoded here in TS) computes. Block-scaled checkpoints load
// dequantized. Other quantization methods, and re-quantizing an fp8 checkpoint, fail with typed errors.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { f32ToF8e4m3Bits, f8e4m3BitsToF32 } from "../../src/backends/dtype.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { readSafetensors, writeSafetensors, type SafetensorsWriteTensor } from "../../src/models/formats/safetensors.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { exportGguf } from "../../src/models/init-model.js";
import { readGguf } from "../../src/models/formats/gguf.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { noGrad, tensor } from "../../src/tensor/index.js";
import { UnsupportedError } from "../../src/util/errors.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { linears, maxAbsDiff } from "../helpers/model-logits.js";

const skip = tryLoadNativeKernels() ? false : "native addon not built";
const PROJ = /\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$/;

type Granularity = "tensor" | "channel" | "block";

/**
 * Writes `<name>-fp8` (the FP8 checkpoint) and `<name>-ref` (float32, each projection = its decoded codes * scale)
 * from the tiny model at `src`.
 */
function writeFp8Pair(src: string, name: string, granularity: Granularity, quantizationConfig: Record<string, unknown>): { fp8: string; ref: string } {
  const fp8 = tempPath(`${name}-fp8`);
  const ref = tempPath(`${name}-ref`);
  const h = readSafetensors(path.join(src, "model.safetensors"));
  const q: SafetensorsWriteTensor[] = [];
  const r: SafetensorsWriteTensor[] = [];
  for (const t of h.tensors) {
    const w = h.loadAsFloat32(t.name);
    if (!PROJ.test(t.name)) {
      q.push({ name: t.name, dtype: "F32", shape: t.shape, data: w });
      r.push({ name: t.name, dtype: "F32", shape: t.shape, data: w });
      continue;
    }
    const [n, k] = t.shape as [number, number];
    const [bn, bk] = granularity === "block" ? [32, 32] : granularity === "channel" ? [1, k] : [n, k];
    const cols = Math.ceil(k / bk);
    const scales = new Float32Array(Math.ceil(n / bn) * cols);
    for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) {
      const s = Math.floor(i / bn) * cols + Math.floor(j / bk);
      scales[s] = Math.max(scales[s]!, Math.abs(w[i * k + j]!) / 448);
    }
    const codes = new Uint8Array(n * k);
    const deq = new Float32Array(n * k);
    for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) {
      const s = scales[Math.floor(i / bn) * cols + Math.floor(j / bk)]!;
      codes[i * k + j] = f32ToF8e4m3Bits(w[i * k + j]! / s);
      deq[i * k + j] = f8e4m3BitsToF32(codes[i * k + j]!) * s;
    }
    q.push({ name: t.name, dtype: "F8_E4M3", shape: [n, k], data: codes });
    const scaleName = granularity === "block" ? `${t.name}_scale_inv` : `${t.name}_scale`;
    const scaleShape = granularity === "block" ? [Math.ceil(n / bn), cols] : granularity === "channel" ? [n, 1] : [];
    q.push({ name: scaleName, dtype: "F32", shape: scaleShape, data: scales });
    q.push({ name: t.name.replace(/weight$/, "input_scale"), dtype: "F32", shape: [], data: new Float32Array([1]) });
    r.push({ name: t.name, dtype: "F32", shape: [n, k], data: deq });
  }
  h.close();
  for (const [dir, tensors, withQc] of [[fp8, q, true], [ref, r, false]] as const) {
    fs.mkdirSync(dir, { recursive: true });
    for (const f of fs.readdirSync(src)) if (f !== "model.safetensors" && f !== "config.json") fs.copyFileSync(path.join(src, f), path.join(dir, f));
    const config = JSON.parse(fs.readFileSync(path.join(src, "config.json"), "utf8")) as Record<string, unknown>;
    if (withQc) config.quantization_config = quantizationConfig;
    fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(config));
    writeSafetensors(path.join(dir, "model.safetensors"), tensors);
  }
  return { fp8, ref };
}

function logits(dir: string, ids: number[], notes: string[] = []): { values: Float32Array; fp8Layers: number; linears: number } {
  const loaded = loadLocalModel(dir, { dtype: "float32", onNote: (m) => notes.push(m) });
  const projections = linears(loaded).filter(([n]) => n !== "lm_head");
  const fp8Layers = projections.filter(([, m]) => quantizedWeightOf(m)?.scheme === "fp8").length;
  const values = noGrad(() => {
    const x = tensor(Int32Array.from(ids));
    const positions = tensor(Int32Array.from(ids, (_, i) => i));
    const hidden = loaded.model.forward(x, { kind: "dense", batch: 1, seqLen: ids.length, positions });
    const out = loaded.model.logits(hidden);
    const v = out.dataSync() as Float32Array; // every position's logits
    for (const t of [x, positions, hidden, out]) t.dispose();
    return v;
  });
  return { values, fp8Layers, linears: projections.length };
}

const ids = [5, 17, 42, 99, 3, 250, 7];
const src = () => tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: { tie_word_embeddings: true } });

describe("fp8 checkpoints", { skip }, () => {
  const cases: [string, Granularity, Record<string, unknown>][] = [
    ["fp8 per-tensor (quant_method fp8)", "tensor", { quant_method: "fp8", activation_scheme: "static" }],
    [
      "compressed-tensors per-channel",
      "channel",
      { quant_method: "compressed-tensors", format: "float-quantized", config_groups: { group_0: { targets: ["Linear"], weights: { num_bits: 8, type: "float", strategy: "channel" } } }, ignore: ["lm_head"] },
    ],
  ];
  for (const [label, granularity, qc] of cases) {
    it(`${label}: every projection runs the fp8 kernel on the file's codes and matches the dequantized float32 model`, () => {
      const { fp8, ref } = writeFp8Pair(src(), granularity, granularity, qc);
      const got = logits(fp8, ids);
      const want = logits(ref, ids);
      assert.equal(got.fp8Layers, got.linears, "every projection is fp8");
      assert.equal(want.fp8Layers, 0);
      const scale = Math.max(...want.values.map(Math.abs));
      const err = maxAbsDiff(got.values, want.values);
      assert.ok(err <= 1e-4 * scale, `max |logit diff| ${err} (logit scale ${scale})`);
    });
  }

  it("block-scaled fp8 (weight_block_size) loads dequantized, with a note, and matches the dequantized model", () => {
    const { fp8, ref } = writeFp8Pair(src(), "block", "block", { quant_method: "fp8", weight_block_size: [32, 32] });
    const notes: string[] = [];
    const got = logits(fp8, ids, notes);
    const want = logits(ref, ids);
    assert.equal(got.fp8Layers, 0);
    assert.ok(notes.some((n) => /block-scaled fp8/.test(n)), notes.join("\n"));
    assert.ok(maxAbsDiff(got.values, want.values) <= 1e-5 * Math.max(...want.values.map(Math.abs)));
  });

  it("kiln convert dequantizes fp8 weights (code * scale) and drops the scales, as convert_hf_to_gguf: the GGUF equals the dequantized model's", () => {
    // it failed with "tensor ...weight_scale has no GGUF name"
    for (const [granularity, qc] of [["tensor", { quant_method: "fp8" }], ["block", { quant_method: "fp8", weight_block_size: [32, 32] }]] as const) {
      const { fp8, ref } = writeFp8Pair(src(), `convert-${granularity}`, granularity, qc);
      const [got, want] = [fp8, ref].map((dir) => {
        const file = path.join(dir, "model.gguf");
        exportGguf(dir, file, "F32");
        return readGguf(file);
      });
      assert.deepEqual(got!.tensors.map((t) => [t.name, t.type, t.shape]), want!.tensors.map((t) => [t.name, t.type, t.shape]), granularity);
      for (const t of want!.tensors) assert.deepEqual(got!.loadAsFloat32(t.name), want!.loadAsFloat32(t.name), `${granularity} ${t.name}`);
      got!.close();
      want!.close();
    }
  });

  it("typed errors: another quantization method, re-quantizing, a missing scale", () => {
    const { fp8 } = writeFp8Pair(src(), "errors", "tensor", { quant_method: "fp8" });
    assert.throws(() => loadLocalModel(fp8, { quantization: "int8" }), (e: Error) => e instanceof UnsupportedError && /fp8 checkpoint/.test(e.message));
    const gptq = tempPath("gptq");
    fs.cpSync(fp8, gptq, { recursive: true });
    const cfg = JSON.parse(fs.readFileSync(path.join(gptq, "config.json"), "utf8")) as Record<string, unknown>;
    fs.writeFileSync(path.join(gptq, "config.json"), JSON.stringify({ ...cfg, quantization_config: { quant_method: "gptq", bits: 4 } }));
    assert.throws(() => loadLocalModel(gptq), (e: Error) => e instanceof UnsupportedError && /"gptq"/.test(e.message));
    const noScale = tempPath("fp8-no-scale");
    fs.mkdirSync(noScale, { recursive: true });
    for (const f of fs.readdirSync(fp8)) if (f !== "model.safetensors") fs.copyFileSync(path.join(fp8, f), path.join(noScale, f));
    const h = readSafetensors(path.join(fp8, "model.safetensors"));
    writeSafetensors(
      path.join(noScale, "model.safetensors"),
      h.tensors.filter((t) => !t.name.endsWith("q_proj.weight_scale")).map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, data: h.load(t.name) })),
    );
    h.close();
    assert.throws(() => loadLocalModel(noScale), /q_proj\.weight is F8_E4M3 but the checkpoint has no .*_scale/);
  });
});
