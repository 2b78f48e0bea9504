// P/D disaggregation on the real runner: a tiny random Llama's prompt K/V copied out of one engine's paged cache
// (float32 and bfloat16 caches, other block sizes on each side) and written into another's gives the same greedy
// tokens as one engine running the request alone, with the decode engine computing only the last prompt token.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EngineCore } from "../../src/engine/engine-core.js";
import { decodeSnapshot, encodeSnapshot } from "../../src/engine/kv-transfer.js";
import { createServingSetupSync } from "../../src/engine/serving.js";
import type { RequestOutput } from "../../src/engine/types.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

function engine(kvCacheDtype: "float32" | "bfloat16", blockSize: number, enforceEager: boolean): EngineCore {
  const s = createServingSetupSync({ model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 128, kvCacheMemory: 2 << 20, kvCacheDtype, blockSize, enforceEager });
  return new EngineCore(s.engineArgs, s.runner, { tokenizer: s.loaded.tokenizer });
}

function run(core: EngineCore): Map<string, RequestOutput> {
  const done = new Map<string, RequestOutput>();
  while (core.hasUnfinishedRequests()) for (const o of core.step()) if (o.finished) done.set(o.requestId, o);
  return done;
}

const PROMPT = Array.from({ length: 37 }, (_, i) => 5 + ((i * 37 + 11) % 200));
const params = { temperature: 0, maxTokens: 8, ignoreEos: true };

for (const dtype of ["float32", "bfloat16"] as const)
  test(`a ${dtype} cache's prompt K/V moves between engines: the decode engine's greedy tokens equal one engine's`, { timeout: 120_000 }, () => {
    const alone = engine(dtype, 16, true);
    alone.addRequest({ requestId: "r", promptTokenIds: PROMPT, params });
    const want = run(alone).get("r")!.outputs[0]!.tokenIds;

    const p = engine(dtype, 16, false);
    p.addRequest({ requestId: "p", promptTokenIds: PROMPT, params: { ...params, maxTokens: 1 }, kvTransfer: { export: true } });
    const snap = run(p).get("p")!.kvSnapshot!;
    assert.equal(snap.layout.dtype, dtype);
    assert.equal(snap.tokenIds.length, PROMPT.length);
    assert.ok(snap.data.some((b) => b !== 0), "the snapshot holds K/V");

    // decode engine with another block size (the snapshot is per token) and step graphs
    const d = engine(dtype, 8, false);
    d.addRequest({ requestId: "r", promptTokenIds: PROMPT, params, kvTransfer: { import: decodeSnapshot(encodeSnapshot(snap)) } });
    const out = run(d).get("r")!;
    assert.deepEqual(out.outputs[0]!.tokenIds, want);
    assert.equal(out.numCachedTokens, PROMPT.length - 1);

    // the control: a snapshot whose K/V is zeroed decodes differently, so the tokens above came from the moved K/V
    const z = engine(dtype, 8, true);
    z.addRequest({ requestId: "z", promptTokenIds: PROMPT, params, kvTransfer: { import: { ...snap, data: new Uint8Array(snap.data.length) } } });
    assert.notDeepEqual(run(z).get("z")!.outputs[0]!.tokenIds, want);
  });
