// compile() over whole model forwards (dispatch capture): for every family, the compiled paged forward equals
// the eager one for token counts on both sides of bucket boundaries, decode steps read back the K/V an earlier
// compiled call wrote, padded rows never touch the KV cache (the null block 0 stays zero and the caches equal
// the eager run's), and a shape change inside a bucket causes no recompile while one outside does. MoE routing
// (host reads) runs as an opaque step (compile's `opaque` option).
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { compile, jitUnavailableReason, type CompiledFunction } from "../../src/compile/index.js";
import { loadLocalModel } from "../../src/models/loader.js";
import type { CausalLM } from "../../src/models/causal-lm.js";
import { MoE } from "../../src/nn/mlp.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

process.env.KILN_CACHE_DIR = mkdtempSync(join(tmpdir(), "kiln-model-compile-test-"));

const FAMILIES = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM", "GptOssForCausalLM"] as const;
const BLOCK = 4;
const BLOCKS = 16; // block 0 is the null block: no sequence uses it
const MAX_BLOCKS = 8;
const TOL = 1e-4;

type Caches = { k: k.Tensor; v: k.Tensor }[];

/**
 * The family's tiny model; Gemma 2's with a soft-cap that bites (scores of a few units) and a 4-token window; gpt-oss's
 * with a 4-token window too (attention sinks in the compiled paged attention, the MoE opaque).
 */
const modelDir = (arch: string): string =>
  arch === "Gemma2ForCausalLM" ? tinyModelDir(arch, { overrides: { attn_logit_softcapping: 1, sliding_window: 4 } })
  : arch === "GptOssForCausalLM" ? tinyModelDir(arch, { overrides: { sliding_window: 4 } })
  : tinyModelDir(arch as (typeof FAMILIES)[number]);

function caches(model: CausalLM): Caches {
  const c = model.config;
  const shape = [BLOCKS, BLOCK, c.numKeyValueHeads, c.headDim];
  return Array.from({ length: c.numHiddenLayers }, () => ({ k: k.zeros(shape), v: k.zeros(shape) }));
}

/** One sequence (blocks 1..MAX_BLOCKS) scheduling tokens [start, start + n). */
function step(model: CausalLM, start: number, n: number) {
  const pos = Int32Array.from({ length: n }, (_, j) => start + j);
  const table = Int32Array.from({ length: MAX_BLOCKS }, (_, b) => b + 1);
  return {
    ids: k.tensor(pos.map((p) => (p * 37 + 5) % model.config.vocabSize)),
    positions: k.tensor(pos),
    slotMapping: k.tensor(pos.map((p) => table[Math.floor(p / BLOCK)]! * BLOCK + (p % BLOCK))),
    blockTables: k.tensor(table, { shape: [1, MAX_BLOCKS] }),
    queryStart: k.tensor(Int32Array.of(0, n)),
    seqLens: k.tensor(Int32Array.of(start + n)),
  };
}

function maxDiff(a: k.Tensor, b: k.Tensor): number {
  assert.deepEqual(a.shape, b.shape);
  const x = a.dataSync() as Float32Array;
  const y = b.dataSync() as Float32Array;
  let m = 0;
  for (let i = 0; i < x.length; i++) m = Math.max(m, Math.abs(x[i]! - y[i]!));
  return m;
}

describe("compile() of model forwards", { skip: jitUnavailableReason() ?? false }, () => {
  // every family in strict mode; a dense and an MoE family again under defer-and-fuse (opaque bodies' deferred kernels)
  // and weight-only quantized projections (quant_matmul nodes)
  type Run = readonly [(typeof FAMILIES)[number], "strict" | "defer-and-fuse", quantization?: "int8" | "int4" | "fp8"];
  const runs: Run[] = [
    ...FAMILIES.map((arch) => [arch, "strict"] as const),
    ["LlamaForCausalLM", "defer-and-fuse"],
    ["Qwen3MoeForCausalLM", "defer-and-fuse"],
    ["LlamaForCausalLM", "strict", "int8"],
    ["Qwen3ForCausalLM", "defer-and-fuse", "int4"],
    ["LlamaForCausalLM", "strict", "fp8"],
    ["Gemma3ForCausalLM", "defer-and-fuse", "int8"],
  ];
  for (const [arch, mode, quantization] of runs) {
    it(`${arch} (${mode}${quantization ? `, ${quantization}` : ""}): compiled paged forward == eager across buckets, prefill then decode`, () => k.withEagerMode(mode, () => {
      const { model } = loadLocalModel(modelDir(arch), { quantization });
      const eagerCaches = caches(model);
      const compiledCaches = caches(model);
      const moe = model.namedModules().flatMap(([, m]) => (m instanceof MoE ? [m] : []));
      const forward: CompiledFunction = compile(
        (ids, positions, slotMapping, blockTables, queryStart, seqLens) =>
          model.forward(ids, { kind: "paged", positions, slotMapping, blockTables, queryStart, seqLens, kvCaches: compiledCaches }),
        { dynamic: [0, 1, 2].map((argIndex) => ({ argIndex, dim: 0, max: 64 })), opaque: moe, name: arch },
      );
      const compiles: Record<number, number> = {};
      for (const T of [1, 2, 3, 4, 5, 8, 9]) {
        // prefill T tokens, then one decode step that attends over the K/V the compiled prefill wrote
        for (const [start, n] of [[0, T], [T, 1]] as const) {
          const s = step(model, start, n);
          const eager = k.noGrad(() => model.forward(s.ids, { kind: "paged", ...s, kvCaches: eagerCaches }));
          const got = forward(s.ids, s.positions, s.slotMapping, s.blockTables, s.queryStart, s.seqLens) as k.Tensor;
          const d = maxDiff(got, eager);
          assert.ok(d < TOL, `${arch} tokens ${n} at ${start}: max |diff| ${d}`);
          for (const t of [eager, got, ...Object.values(s)]) t.dispose();
        }
        compiles[T] = forward.stats.compiles;
      }
      assert.equal(forward.lastInfo?.jit, true);
      // buckets 1, 2, 4, 8, 16: 3 -> 4 stays in bucket 4, 4 -> 5 moves to 8, 8 -> 9 to 16
      assert.equal(compiles[4], compiles[3], "3 -> 4 tokens recompiled");
      assert.equal(compiles[5], compiles[4]! + 1, "4 -> 5 tokens did not recompile");
      assert.equal(compiles[8], compiles[5], "5 -> 8 tokens recompiled");
      assert.equal(compiles[9], compiles[8]! + 1, "8 -> 9 tokens did not recompile");
      assert.equal(forward.stats.recompiles, forward.stats.compiles - 1);
      // padded rows never wrote the cache: both runs left identical caches, null block 0 untouched
      compiledCaches.forEach((c, layer) => {
        for (const key of ["k", "v"] as const) {
          assert.ok(maxDiff(c[key], eagerCaches[layer]![key]) < TOL, `layer ${layer} ${key} cache`);
          const nullBlock = c[key].narrow(0, 0, 1);
          assert.ok((nullBlock.dataSync() as Float32Array).every((x) => x === 0), `layer ${layer} ${key}: null block written`);
          nullBlock.dispose();
        }
      });
      for (const c of [...eagerCaches, ...compiledCaches]) for (const t of [c.k, c.v]) t.dispose();
    }));
  }

  it("MoE routing without the opaque option is a clear error", () => {
    const { model } = loadLocalModel(tinyModelDir("MixtralForCausalLM"));
    const kv = caches(model);
    const forward = compile(
      (ids, positions, slotMapping, blockTables, queryStart, seqLens) =>
        model.forward(ids, { kind: "paged", positions, slotMapping, blockTables, queryStart, seqLens, kvCaches: kv }),
      { capture: "dispatch" },
    );
    const s = step(model, 0, 3);
    assert.throws(() => forward(s.ids, s.positions, s.slotMapping, s.blockTables, s.queryStart, s.seqLens), /cannot capture the sort kernel.*opaque/);
    for (const t of Object.values(s)) t.dispose();
  });

  it("a host read of a traced value is an error, and the defer-and-fuse recorder is restored after it", () => {
    const f = compile((x: k.Tensor) => k.tensor([x.mul(2).sum().item()]), { capture: "dispatch" });
    assert.throws(() => f(k.ones([4])), /read on the host/);
    const y = k.withEagerMode("defer-and-fuse", () => k.ones([4]).mul(3).add(1));
    assert.deepEqual(y.toList(), [4, 4, 4, 4]);
    y.dispose();
  });
});
