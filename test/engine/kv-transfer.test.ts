// P/D disaggregation in the engine: a prefill engine's request that asks to export hands out its prompt's K/V when it
// finishes; a decode engine given that snapshot writes it into its blocks and computes only the last prompt token,
// and samples exactly what one engine doing both would. The fake runner checks every slot's context hash chain, so
// K/V written into the wrong slots, or for another prompt, throws.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EngineInputError } from "../../src/engine/errors.js";
import { decodeSnapshot, encodeSnapshot, KvTransferError, type KvSnapshot } from "../../src/engine/kv-transfer.js";
import { add, makeEngine, prompt, runToCompletion } from "./helpers.js";

const P = prompt(5, 23); // 5 full blocks of 4 and 3 tokens
const params = { temperature: 0, maxTokens: 12, ignoreEos: true };

function prefill(promptIds: number[]): KvSnapshot {
  const { core } = makeEngine();
  core.addRequest({ requestId: "p", promptTokenIds: promptIds, params: { ...params, maxTokens: 1 }, kvTransfer: { export: true } });
  const out = runToCompletion(core).get("p")!;
  assert.equal(out.outputs[0]!.finishReason, "length");
  assert.ok(out.kvSnapshot !== undefined, "the final output carries the snapshot");
  return out.kvSnapshot;
}

test("a decode engine given a prefill engine's K/V computes only the last prompt token and samples as one engine", () => {
  const snap = prefill(P);
  assert.deepEqual(snap.tokenIds, P);
  assert.equal(snap.data.length, 2 * P.length * 12);
  const alone = makeEngine();
  add(alone.core, "r", P, params);
  const want = runToCompletion(alone.core).get("r")!.outputs[0]!.tokenIds;

  const d = makeEngine();
  d.core.addRequest({ requestId: "r", promptTokenIds: P, params, kvTransfer: { import: decodeSnapshot(encodeSnapshot(snap)) } });
  const out = runToCompletion(d.core).get("r")!;
  assert.deepEqual(out.outputs[0]!.tokenIds, want);
  assert.equal(d.runner.numKvWrites, P.length - 1, "every prompt token but the last came from the snapshot");
  assert.deepEqual(d.runner.log[0], [{ requestId: "r", numTokens: 1, start: P.length - 1 }]);
  assert.equal(out.numCachedTokens, P.length - 1);
  // the imported blocks are in the decode engine's prefix cache: the same prompt again hits all its full blocks
  add(d.core, "again", P, params);
  const again = runToCompletion(d.core).get("again")!;
  assert.equal(again.numCachedTokens, 20);
  assert.deepEqual(again.outputs[0]!.tokenIds, want);
});

test("a snapshot of another prompt counts only the common prefix; a prefix-cache hit beyond it wins", () => {
  const other = [...P.slice(0, 9), ...prompt(9, 14)];
  const snap = prefill(other);
  const d = makeEngine();
  d.core.addRequest({ requestId: "r", promptTokenIds: P, params, kvTransfer: { import: snap } });
  const out = runToCompletion(d.core).get("r")!;
  assert.equal(d.runner.numKvWrites, 9);
  assert.deepEqual(d.runner.log[0], [{ requestId: "r", numTokens: P.length - 9, start: 9 }]);
  const alone = makeEngine();
  add(alone.core, "r", P, params);
  assert.deepEqual(out.outputs[0]!.tokenIds, runToCompletion(alone.core).get("r")!.outputs[0]!.tokenIds);

  // the decode engine already holds 20 tokens of P in its prefix cache: only the rest would be imported (none here)
  d.runner.numKvWrites = 0;
  d.core.addRequest({ requestId: "s", promptTokenIds: P, params, kvTransfer: { import: snap } });
  runToCompletion(d.core);
  assert.equal(d.runner.numKvWrites, 0);
});

test("exports only finished prompts; typed errors for what cannot move", () => {
  const { core } = makeEngine();
  core.addRequest({ requestId: "a", promptTokenIds: P, params: { ...params, maxTokens: 50 }, kvTransfer: { export: true } });
  core.step();
  const [aborted] = core.abortRequest(["a"]);
  assert.equal(aborted!.kvSnapshot, undefined, "an aborted request exports nothing");
  assert.throws(
    () => core.addRequest({ requestId: "n", promptTokenIds: P, params: { n: 2 }, kvTransfer: { export: true } }),
    (e: unknown) => e instanceof EngineInputError && e.param === "kv_transfer_params" && /n = 2/.test(e.message),
  );
  const snap = prefill(P);
  const wrong: KvSnapshot = { ...snap, layout: { ...snap.layout, numLayers: 2 } };
  assert.throws(
    () => core.addRequest({ requestId: "w", promptTokenIds: P, params, kvTransfer: { import: wrong } }),
    (e: unknown) => e instanceof EngineInputError && /numLayers 2 where this engine has 1/.test(e.message),
  );
  assert.equal(core.hasUnfinishedRequests(), false, "nothing was queued");
  // the wire form: a truncated or altered snapshot is a typed error
  const bytes = encodeSnapshot(snap);
  assert.throws(() => decodeSnapshot(bytes.subarray(0, bytes.length - 1)), KvTransferError);
  assert.throws(() => decodeSnapshot(new Uint8Array(16)), /bad magic/);
});
