// Test fixtures: EAGLE heads with random (or given) weights in the checkpoint layout SafeAILab's EAGLE and vLLM read
// (fc.weight, layers.{i}.* for EAGLE-1; fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d for EAGLE-3).
import * as fs from "node:fs";
import * as path from "node:path";
import { EagleHead, type EagleMethod } from "../../src/models/eagle-head.js";
import type { CausalLM } from "../../src/models/causal-lm.js";
import { parseHfConfig } from "../../src/models/hf-config.js";
import { writeSafetensors, type SafetensorsWriteTensor } from "../../src/models/formats/safetensors.js";
import { tempPath } from "./tiny-model.js";

export interface EagleHeadOptions {
  method: EagleMethod;
  /** config.json fields over the defaults (the target's sizes, one layer). */
  config?: Record<string, unknown>;
  seed?: number;
  std?: number;
  /** Given values of some parameters (by checkpoint name), the rest random (norms 1). */
  weights?: Record<string, Float32Array>;
  /** EAGLE-3: d2t offsets (draft -> target token), written when given. */
  d2t?: readonly number[];
}

/** A deterministic N(0, 1) stream. */
function normals(seed: number): () => number {
  let s = seed >>> 0 || 1;
  const u = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) + 0.5) / 2 ** 32;
  return () => Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u());
}

/** Writes an EAGLE head for the target model directory `targetDir` into a fresh directory and returns it. */
export function writeEagleHead(targetDir: string, name: string, o: EagleHeadOptions): string {
  const targetJson = JSON.parse(fs.readFileSync(path.join(targetDir, "config.json"), "utf8")) as Record<string, unknown>;
  const keep = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings", "hidden_act"];
  const json: Record<string, unknown> = {
    architectures: [o.method === "eagle" ? "LlamaForCausalLM" : "LlamaForCausalLMEagle3"],
    ...Object.fromEntries(keep.map((k) => [k, targetJson[k]])),
    num_hidden_layers: 1,
    ...o.config,
  };
  // (the names and shapes only: a head that does not fit its target is written as well)
  const layer = parseHfConfig({ ...json, architectures: ["LlamaForCausalLM"] });
  const num = (k: string, dflt: number) => (typeof json[k] === "number" ? (json[k] as number) : dflt);
  const config = { method: o.method, layer, targetHiddenSize: num("target_hidden_size", layer.hiddenSize), draftVocabSize: num("draft_vocab_size", layer.vocabSize), auxLayers: [], normBeforeResidual: false };
  const head = new EagleHead(config, null as unknown as CausalLM, { unallocatedParameters: true, ownEmbed: false });
  const normal = normals(o.seed ?? 3);
  const std = o.std ?? 0.2;
  const tensors: SafetensorsWriteTensor[] = head.namedParameters().map(([n, t]) => {
    const given = o.weights?.[n];
    if (given !== undefined && given.length !== t.numel) throw new Error(`${n}: ${given.length} values for shape [${t.shape.join(", ")}]`);
    const v = given ?? Float32Array.from({ length: t.numel }, () => (n.endsWith("norm.weight") ? 1 : normal() * std));
    return { name: n, dtype: "F32", shape: [...t.shape], data: v };
  });
  if (o.d2t !== undefined) {
    tensors.push({ name: "d2t", dtype: "I64", shape: [o.d2t.length], data: BigInt64Array.from(o.d2t, BigInt) });
    const V = Number(json.vocab_size);
    const t2d = new Uint8Array(V);
    o.d2t.forEach((off, d) => (t2d[d + off] = 1));
    tensors.push({ name: "t2d", dtype: "BOOL", shape: [V], data: t2d });
  }
  const dir = tempPath(`eagle-${name}`);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(json, null, 2));
  writeSafetensors(path.join(dir, "model.safetensors"), tensors);
  return dir;
}
