// What LoRA serving costs: single-stream greedy decode of the SmolLM-135M-shaped bench model (bf16; --model 1b
// for the Llama-1B-shaped one) without LoRA, with LoRA enabled but the request on the base model, and with the
// request on a rank-16 adapter over every projection; the engines alternate in rounds within one process, and the
// ratios printed are each round's against the same round's plain engine (median over rounds).
// Usage: node dist/bench/lora.js [--model smollm|1b] [--rounds 5] [--tokens 64] [--max-loras 1] [--rank 16]
import * as os from "node:os";
import * as path from "node:path";
import { LLM } from "../src/engine/llm-engine.js";
import type { LoraRequest } from "../src/engine/lora-manager.js";
import { allProjections, writeLoraAdapter } from "../test/helpers/lora-adapter.js";
import { BENCH_MODELS, benchModelDir } from "./bench-models.js";

const option = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : dflt;
};
const preset = BENCH_MODELS[option("--model", "smollm")];
if (preset === undefined) throw new Error(`--model must be one of ${Object.keys(BENCH_MODELS).join(", ")}`);
const rounds = Number(option("--rounds", "5"));
const tokens = Number(option("--tokens", "64"));
const maxLoras = Number(option("--max-loras", "1"));
const rank = Number(option("--rank", "16"));

const model = benchModelDir("bfloat16", preset);
const layers = preset === "llama-1b" ? 16 : 30;
const adapterDir = writeLoraAdapter(model, path.join(os.tmpdir(), `kiln-bench-lora-${preset}-r${rank}`), {
  rank, alpha: 2 * rank, modules: allProjections(layers), seed: 5, std: 0.01,
});
const lora: LoraRequest = { name: "bench", id: 1, path: adapterDir };
const common = { model, maxModelLen: 256, kvCacheMemory: 64 << 20, maxNumSeqs: 4 };
const plain = new LLM(common);
const enabled = new LLM({ ...common, enableLora: true, maxLoras, maxLoraRank: rank });
const prompt = { promptTokenIds: Array.from({ length: 16 }, (_, i) => 10 + i) };
const params = { temperature: 0, maxTokens: tokens, ignoreEos: true };

/** Decode tokens/s of one request (the prompt's step excluded: time from its first token to its last). */
function decodeRate(llm: LLM, loraRequest: LoraRequest | null): number {
  const t0 = performance.now();
  const [out] = llm.generate([prompt], params, { loraRequest });
  const m = out!.metrics;
  const first = m?.firstTokenTime ?? t0;
  const last = m?.lastTokenTime ?? performance.now();
  return (out!.outputs[0]!.tokenIds.length - 1) / ((last - first) / 1000);
}

for (let i = 0; i < 2; i++) for (const [llm, l] of [[plain, null], [enabled, null], [enabled, lora]] as const) decodeRate(llm, l); // warm-up
const rows: { plain: number; base: number; adapter: number }[] = [];
for (let r = 0; r < rounds; r++) rows.push({ plain: decodeRate(plain, null), base: decodeRate(enabled, null), adapter: decodeRate(enabled, lora) });
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
console.log(`${preset} bf16, one stream, ${tokens} tokens, max_loras ${maxLoras}, rank ${rank}, ${rounds} rounds (tok/s per round):`);
for (const row of rows) console.log(`  plain ${row.plain.toFixed(1)}  lora on, base model ${row.base.toFixed(1)}  lora on, adapter ${row.adapter.toFixed(1)}`);
console.log(
  `median ratio to the plain engine: LoRA enabled, base-model request ${median(rows.map((x) => x.base / x.plain)).toFixed(3)}x; ` +
    `adapter request ${median(rows.map((x) => x.adapter / x.plain)).toFixed(3)}x`,
);
