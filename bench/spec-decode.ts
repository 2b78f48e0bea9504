// What draft-model speculative decoding buys on CPU, where a decode step reads every weight: a bandwidth-bound served
// model and a small trained draft that agrees with it. No trained pair of a large and a small model exists here (no
// downloads), so the served model is Kiln's trained default model (models/kiln-default: hidden 256, 4 layers)
// *widened*: hidden and intermediate padded with zeros (its norms' weights and eps rescaled so each RMSNorm gives the
// same values), heads padded with zero q/k/v rows, and `--layers` - 4 more layers whose o_proj and down_proj are zero
// (their other weights random: read every step, adding nothing). It computes kiln-default's function at the cost of a
// model of its size. The drafts are kiln-default itself (agreeing up to rounding) and its first 2 and 1 layers
// (LayerSkip-style early exits, weaker). Greedy single-stream decode of real English prompts; each engine runs
// in its own process, each configuration right after a plain run (this VM's bandwidth drifts); each line is the best
// round's tokens/s over four prompts, the drafts' acceptance, and the ratio to the plain run just before it.
// Outputs are checked equal to the plain engine's (greedy speculation changes nothing).
// Usage: node dist/bench/spec-decode.js [--hidden 1024] [--layers 16] [--dtype bfloat16] [--k 2,4] [--rounds 3] [--tokens 96]
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { LLM } from "../src/engine/llm-engine.js";
import { readSafetensors, writeSafetensors, type SafetensorsLazyTensor } from "../src/models/formats/safetensors.js";
import { DEFAULT_MODEL_DIR } from "../src/cli/default-model.js";
import { f32ToBf16 } from "../src/models/formats/dtype-convert.js";
import { Tokenizer } from "../src/models/tokenizer.js";

const option = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : dflt;
};
const hidden = Number(option("--hidden", "1024"));
const layers = Number(option("--layers", "16"));
const dtype = option("--dtype", "bfloat16") as "bfloat16" | "float32";
const ks = option("--k", "2,4").split(",").map(Number);
const rounds = Number(option("--rounds", "3"));
const tokens = Number(option("--tokens", "96"));

type Json = Record<string, unknown>;
const base = DEFAULT_MODEL_DIR;
const baseConfig = JSON.parse(fs.readFileSync(path.join(base, "config.json"), "utf8")) as Json;
const h0 = baseConfig.hidden_size as number;
const i0 = baseConfig.intermediate_size as number;
const l0 = baseConfig.num_hidden_layers as number;
const heads0 = baseConfig.num_attention_heads as number;
const headDim = h0 / heads0;
if (hidden < h0 || hidden % headDim !== 0 || layers < l0) throw new Error(`--hidden must be a multiple of ${headDim} >= ${h0}, --layers >= ${l0}`);
const inter = Math.round((i0 * hidden) / h0);

function copyTokenizer(dir: string): void {
  for (const f of ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]) fs.copyFileSync(path.join(base, f), path.join(dir, f));
}

/** Pads a [rows, cols] row-major matrix with zeros to [R, C] (the original in the top-left corner). */
function pad(src: Float32Array, rows: number, cols: number, R: number, C: number): Float32Array {
  const out = new Float32Array(R * C);
  for (let r = 0; r < rows; r++) out.set(src.subarray(r * cols, (r + 1) * cols), r * C);
  return out;
}

/** kiln-default widened to `hidden`, with layers past its own that add nothing (see the top). */
function widenedTarget(): string {
  const dir = path.join(os.tmpdir(), `kiln-bench-spec-target-${hidden}-${layers}-${dtype}`);
  if (fs.existsSync(path.join(dir, "model.safetensors"))) return dir;
  fs.mkdirSync(dir, { recursive: true });
  const heads = hidden / headDim;
  // RMSNorm over the padded width: mean(x^2) shrinks by h0/hidden; eps and the weights scaled to give the same values
  const shrink = h0 / hidden;
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({
    ...baseConfig, hidden_size: hidden, intermediate_size: inter, num_hidden_layers: layers, num_attention_heads: heads,
    num_key_value_heads: heads, head_dim: headDim, rms_norm_eps: (baseConfig.rms_norm_eps as number) * shrink, torch_dtype: dtype,
  }));
  copyTokenizer(dir);
  const st = readSafetensors(path.join(base, "model.safetensors"));
  let seed = 12345;
  const random = (n: number): Float32Array => {
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      seed = (seed * 1103515245 + 12345) >>> 0;
      v[i] = ((seed / 2 ** 32) - 0.5) * 0.04;
    }
    return v;
  };
  const shapes: Record<string, [number, number]> = {
    "self_attn.q_proj": [hidden, hidden], "self_attn.k_proj": [hidden, hidden], "self_attn.v_proj": [hidden, hidden],
    "self_attn.o_proj": [hidden, hidden], "mlp.gate_proj": [inter, hidden], "mlp.up_proj": [inter, hidden], "mlp.down_proj": [hidden, inter],
  };
  const tensors: SafetensorsLazyTensor[] = [];
  const put = (name: string, shape: number[], values: () => Float32Array, keepF32 = false) =>
    tensors.push({ name, dtype: keepF32 || dtype === "float32" ? "F32" : "BF16", shape, data: () => (keepF32 || dtype === "float32" ? values() : f32ToBf16(values())) });
  const norm = (name: string) => () => {
    const w = st.loadAsFloat32(name);
    const out = new Float32Array(hidden);
    for (let i = 0; i < h0; i++) out[i] = w[i]! * Math.sqrt(shrink);
    return out;
  };
  put("model.embed_tokens.weight", [baseConfig.vocab_size as number, hidden], () => pad(st.loadAsFloat32("model.embed_tokens.weight"), baseConfig.vocab_size as number, h0, baseConfig.vocab_size as number, hidden));
  put("model.norm.weight", [hidden], norm("model.norm.weight"), true);
  for (let l = 0; l < layers; l++) {
    const p = `model.layers.${l}`;
    const own = l < l0;
    put(`${p}.input_layernorm.weight`, [hidden], own ? norm(`${p}.input_layernorm.weight`) : () => new Float32Array(hidden).fill(1), true);
    put(`${p}.post_attention_layernorm.weight`, [hidden], own ? norm(`${p}.post_attention_layernorm.weight`) : () => new Float32Array(hidden).fill(1), true);
    for (const [m, [R, C]] of Object.entries(shapes)) {
      const name = `${p}.${m}.weight`;
      const zero = m === "self_attn.o_proj" || m === "mlp.down_proj";
      const [r0, c0] = m === "mlp.down_proj" ? [h0, i0] : m.startsWith("mlp.") ? [i0, h0] : [h0, h0];
      put(name, [R, C], own ? () => pad(st.loadAsFloat32(name), r0, c0, R, C) : zero ? () => new Float32Array(R * C) : () => random(R * C));
    }
  }
  writeSafetensors(path.join(dir, "model.safetensors"), tensors);
  st.close();
  return dir;
}

/** kiln-default cut to its first `keep` layers (an early exit: its final norm and head after layer keep - 1). */
function earlyExit(keep: number): string {
  if (keep === l0) return base;
  const dir = path.join(os.tmpdir(), `kiln-bench-spec-draft-${keep}`);
  if (fs.existsSync(path.join(dir, "model.safetensors"))) return dir;
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({ ...baseConfig, num_hidden_layers: keep }));
  copyTokenizer(dir);
  const st = readSafetensors(path.join(base, "model.safetensors"));
  const kept = st.tensors.filter((t) => {
    const m = /^model\.layers\.(\d+)\./.exec(t.name);
    return m === null || Number(m[1]) < keep;
  });
  writeSafetensors(path.join(dir, "model.safetensors"), kept.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, data: st.load(t.name) })));
  st.close();
  return dir;
}

/** Several prompts, each decoded in turn: drafts agree with some texts more than others. */
const PROMPTS = [
  "The city council met on Tuesday evening to discuss the new budget, and the mayor said that",
  "It was a cold morning in the small town, and the children",
  "The committee reported that the program had been",
  "She looked at the old house for a long time before",
];

/** One configuration's measurement, in its own process (each holds one served model: their weights do not compete). */
function measure(spec: { draft: string; k: number } | null): void {
  const llm = new LLM({
    model: widenedTarget(), maxModelLen: 512, kvCacheMemory: 64 << 20, maxNumSeqs: 4,
    ...(spec === null ? {} : { speculativeConfig: { model: spec.draft, numSpeculativeTokens: spec.k } }),
  });
  const tok = Tokenizer.fromDir(base);
  const prompts = PROMPTS.map((p) => ({ promptTokenIds: tok.encode(p, { addSpecialTokens: false }) }));
  const params = { temperature: 0, maxTokens: tokens, ignoreEos: true };
  llm.generate([prompts[0]!], { ...params, maxTokens: 8 }); // warm-up
  let best = 0;
  let outputs: number[][] = [];
  const before = llm.engine.stats();
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    outputs = prompts.map((p) => [...llm.generate([p], params)[0]!.outputs[0]!.tokenIds]);
    best = Math.max(best, ((tokens * prompts.length) / (performance.now() - t0)) * 1000);
  }
  const after = llm.engine.stats();
  const drafted = (after.specDraftTokens ?? 0) - (before.specDraftTokens ?? 0);
  const accepted = (after.specAcceptedTokens ?? 0) - (before.specAcceptedTokens ?? 0);
  process.stdout.write(`${JSON.stringify({ best, drafted, accepted, outputs, reply: tok.decode(outputs[0]!) })}\n`);
}

const child = option("--child", "");
if (child !== "") {
  measure(child === "plain" ? null : (JSON.parse(child) as { draft: string; k: number }));
} else {
  const target = widenedTarget();
  const configs: { name: string; arg: string }[] = [];
  for (const keep of [l0, 2, 1]) {
    for (const k of ks) configs.push({ name: `draft ${keep === l0 ? "kiln-default" : `first ${keep} layer${keep > 1 ? "s" : ""}`}, k=${k}`, arg: JSON.stringify({ draft: earlyExit(keep), k }) });
  }
  const args = process.argv.slice(2).filter((_, i, a) => a[i] !== "--child" && a[i - 1] !== "--child");
  type Result = { best: number; drafted: number; accepted: number; outputs: number[][]; reply: string };
  const runChild = (arg: string): Result => {
    const out = execFileSync(process.execPath, ["--expose-gc", process.argv[1]!, ...args, "--child", arg], { encoding: "utf8", maxBuffer: 1 << 26 });
    return JSON.parse(out.trim().split("\n").at(-1)!) as Result;
  };
  // each configuration right after a plain run of its own: this VM's bandwidth drifts by 1.5x within minutes
  const results = configs.map(({ name, arg }) => ({ name, plain: runChild("plain"), spec: runChild(arg) }));
  const reference = results[0]!.plain;
  console.log(`served: kiln-default widened to hidden ${hidden}, ${layers} layers, ${dtype} (${target}); ${PROMPTS.length} prompts x ${tokens} greedy tokens, best of ${rounds} rounds, one process per run`);
  console.log(`first reply: ${JSON.stringify(reference.reply)}`);
  for (const { name, plain, spec } of results) {
    for (const r of [plain, spec]) if (JSON.stringify(r.outputs) !== JSON.stringify(reference.outputs)) throw new Error(`${name}: greedy outputs differ from the plain engine's`);
    const acc = `${((100 * spec.accepted) / Math.max(1, spec.drafted)).toFixed(0)}% of ${spec.drafted} drafts accepted`;
    console.log(`  ${name.padEnd(28)} ${spec.best.toFixed(1).padStart(7)} tok/s vs plain ${plain.best.toFixed(1).padStart(6)} just before: ${(spec.best / plain.best).toFixed(2)}x; ${acc}`);
  }
}
