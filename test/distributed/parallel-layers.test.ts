// Tensor-parallel layers across 2 launched ranks: each rank's ColumnParallelLinear output is its slice of the
// unsharded Linear's output features; RowParallelLinear (all-reduced partial sums, bias once), a parallel GatedMLP and
// an Attention with its heads and KV heads split give the unsharded layer's whole output on every rank (f32, 1e-5).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { divideForTp, TensorParallelError } from "../../src/nn/index.js";
import { cleanup, runRanks, skipWithoutGloo } from "./run-ranks.js";

function assertClose(got: number[], want: number[], tol: number, what: string): void {
  assert.equal(got.length, want.length, `${what}: length`);
  let worst = 0;
  for (let i = 0; i < got.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!));
  assert.ok(worst <= tol, `${what}: max |diff| ${worst} > ${tol}`);
}

describe("tensor-parallel layers (2 ranks)", { skip: skipWithoutGloo }, () => {
  it("column, row, MLP and attention shards reproduce the unsharded layers", { timeout: 60_000 }, async () => {
    const world = 2;
    const run = await runRanks("parallel-layers-worker", world);
    try {
      assert.equal(run.exitCode, 0, run.log.join("\n"));
      const OUT = 12;
      const rows = 5;
      const part = OUT / world;
      for (let rank = 0; rank < world; rank++) {
        const r = run.results[rank] as Record<string, number[]>;
        assert.ok(r, `rank ${rank} wrote no result`);
        // column-parallel: this rank's features [rank * part, (rank + 1) * part) of every row, exactly
        const want = Array.from({ length: rows }, (_, i) => r.linearFull!.slice(i * OUT + rank * part, i * OUT + (rank + 1) * part)).flat();
        assert.deepEqual(r.column, want, `rank ${rank}: column-parallel output`);
        assertClose(r.row!, r.rowFull!, 1e-5, `rank ${rank}: row-parallel output`);
        assertClose(r.mlp!, r.mlpFull!, 1e-5, `rank ${rank}: parallel GatedMLP output`);
        assertClose(r.attn!, r.attnFull!, 1e-5, `rank ${rank}: parallel attention output`);
        assert.deepEqual(r.attnLocalHeads, [2, 1, 16, 16], `rank ${rank}: heads, KV heads, q rows, o_proj columns`);
      }
      assert.deepEqual(run.results[0]!.row, run.results[1]!.row, "the all-reduced output is the same on both ranks");
    } finally {
      cleanup(run);
    }
  });

  it("divideForTp names the field that does not divide", () => {
    assert.equal(divideForTp("num_attention_heads", 8, 2), 4);
    assert.throws(() => divideForTp("num_key_value_heads", 3, 2), (e: unknown) => e instanceof TensorParallelError && /num_key_value_heads \(3\) is not divisible by tensor_parallel_size \(2\)/.test((e as Error).message));
  });
});
