// Collectives across real processes started by the launcher: every result is checked against values computed here
// from the ranks' inputs (collectiveInput), for each reduce op and dtype, with 2 and 3 ranks, env:// and file://.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { collectiveInput, REDUCE_CASES } from "./fixtures/collective-inputs.js";
import { cleanup, runRanks, skipWithoutGloo, type RanksRun } from "./run-ranks.js";

/** Round-to-nearest-even to bfloat16, as the tensor cast does. */
function bf16(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer);
  u[0] = ((u[0]! + 0x7fff + ((u[0]! >>> 16) & 1)) >>> 16) << 16;
  return f[0]!;
}

function expectedReduce(op: string, world: number, i: number): number {
  const xs = Array.from({ length: world }, (_, r) => collectiveInput(r)[i]!);
  switch (op) {
    case "sum": return xs.reduce((a, b) => a + b, 0);
    case "avg": return Math.fround(xs.reduce((a, b) => a + b, 0) / world);
    case "product": return xs.reduce((a, b) => a * b, 1);
    case "min": return Math.min(...xs);
    default: return Math.max(...xs);
  }
}

function checkRun(run: RanksRun, world: number): void {
  assert.equal(run.exitCode, 0, run.log.join("\n"));
  for (let rank = 0; rank < world; rank++) {
    const res = run.results[rank];
    assert.ok(res, `rank ${rank} wrote no result`);
    assert.equal(res.rank, rank);
    assert.equal(res.world, world);
    assert.equal(res.isInitialized, true);
    assert.equal(res.isInitializedAfter, false);
    for (const [dtype, op] of REDUCE_CASES) {
      const got = res[`all_reduce/${dtype}/${op}`] as { values: number[]; dtype: string };
      const want = [0, 1, 2, 3, 4].map((i) => (dtype === "bfloat16" ? bf16(expectedReduce(op, world, i)) : expectedReduce(op, world, i)));
      assert.equal(got.dtype, dtype);
      assert.deepEqual(got.values, want, `all_reduce ${dtype} ${op} on rank ${rank}`);
    }
    const s = (world * (world - 1)) / 2;
    assert.deepEqual(res.noncontiguous, [1, 2, 3, 4].map((v) => v * world + s));
    for (const dtype of ["float32", "int32", "bfloat16"]) assert.deepEqual(res[`broadcast/${dtype}`], collectiveInput(world - 1), `broadcast ${dtype}`);
    assert.deepEqual(res.all_gather, Array.from({ length: world }, (_, j) => collectiveInput(j)));
    assert.deepEqual(res.all_gather_into_tensor, Array.from({ length: world }, (_, j) => collectiveInput(j)).flat());
    assert.deepEqual(res.reduce_scatter, [0, 1, 2, 3, 4].map((i) => expectedReduce("sum", world, i) + 100 * rank * world));
    assert.deepEqual(res.reduce_scatter_tensor, [0, 1, 2, 3, 4].map((i) => Math.max(...Array.from({ length: world }, (_, r) => collectiveInput(r)[i]! * (rank + 1)))));
    const prev = (rank + world - 1) % world;
    assert.equal(res.recv_from, prev);
    assert.deepEqual(res.send_recv, collectiveInput(prev));
    const inputs = Array.from({ length: world }, (_, j) => collectiveInput(j));
    assert.deepEqual(res.reduce, rank === world - 1 ? [0, 1, 2, 3, 4].map((i) => expectedReduce("sum", world, i)) : collectiveInput(rank), "reduce: only dst changes");
    assert.deepEqual(res.gather, rank === 0 ? inputs : null);
    assert.deepEqual(res.scatter, collectiveInput(rank).map((v) => 10 * v));
    // rank j sent this rank (j + rank + 1) elements 100 j + 10 rank + k
    assert.deepEqual(res.all_to_all, inputs.map((_, j) => Array.from({ length: j + rank + 1 }, (_, k) => 100 * j + 10 * rank + k)));
    assert.deepEqual(res.all_to_all_single, inputs.flatMap((_, j) => [10 * j + rank, 10 * j + rank + 0.5]));
    // rank j's rows for this rank start at row 1 + 2 + ... + rank = rank (rank + 1) / 2 of its input
    const first = (rank * (rank + 1)) / 2;
    assert.deepEqual(res.all_to_all_single_uneven, inputs.flatMap((_, j) => Array.from({ length: rank + 1 }, (_, k) => 1000 * j + first + k)));
    const words = Array.from({ length: world }, (_, r) => [12 | r, 1 << r, 255 ^ (3 * r), -1 - r]);
    const fold = (f: (a: number, b: number) => number): number[] => words.reduce((acc, w) => acc.map((a, i) => f(a, w[i]!)));
    for (const dtype of ["int32", "int64"]) {
      assert.deepEqual(res[`bitwise/${dtype}/band`], fold((a, b) => a & b), `band ${dtype}`);
      assert.deepEqual(res[`bitwise/${dtype}/bor`], fold((a, b) => a | b), `bor ${dtype}`);
      assert.deepEqual(res[`bitwise/${dtype}/bxor`], fold((a, b) => a ^ b), `bxor ${dtype}`);
    }
    const prevRank = (rank + world - 1) % world;
    assert.deepEqual(res.isend_irecv, { waits: [true, true], completed: [true, true], values: collectiveInput(prevRank) });
    assert.deepEqual(res.irecv_send, [prevRank, 2 * prevRank]);
    assert.deepEqual(res.irecv_order, [2, 3, 1].map((n, k) => Array.from({ length: n }, (_, i) => 100 * prevRank + 10 * k + i)));
    assert.deepEqual(res.all_reduce_async, { isWork: true, completed: true, wait: true, values: [(world * (world + 1)) / 2] });
    // nobody leaves the barrier before the late rank entered it
    const lastArrived = (run.results[world - 1]!.barrier as { arrived: number }).arrived;
    const { arrived, left } = res.barrier as { arrived: number; left: number };
    assert.ok(left >= lastArrived - 2, `rank ${rank} left the barrier at ${left}, before the last rank arrived at ${lastArrived}`);
    if (rank !== world - 1) assert.ok(left - arrived >= 250, `rank ${rank} waited only ${left - arrived} ms in the barrier`);
    // torch.distributed's helpers
    assert.deepEqual(res.backend, ["gloo", rank < 2 ? "gloo" : null]);
    assert.deepEqual(res.group_ranks, [Array.from({ length: world }, (_, r) => r), [0, 1]]);
    assert.equal(res.backend_non_member, rank < 2 ? null : "DistributedError: [get_backend] invalid process group: rank 2 is not a member of the group [0, 1]");
    assert.deepEqual(res.all_gather_object, Array.from({ length: world }, (_, r) => ({
      rank: r, big: `1${"0".repeat(20 + r)}`, tags: [[`r${r}`, ["x".repeat(r)]]], fill: new Array(r + 1).fill(r),
    })));
    assert.deepEqual(res.broadcast_object_list, [{ lr: 0.001 }, "text", [1, 2, world - 1]]);
    assert.deepEqual(res.gather_object, rank === 0 ? Array.from({ length: world }, (_, r) => `hello from ${r}${"!".repeat(r)}`) : null);
    assert.deepEqual(res.scatter_object_list, [{ to: rank, payload: "y".repeat(rank) }]);
    assert.deepEqual(res.sub_all_gather_object, rank < 2 ? [[0], [1]] : undefined);
    assert.equal(res.object_refused, rank === 1
      ? "DistributedError: [all_gather_object] obj.f is a function, which cannot be sent (objects travel as structured clones)"
      : "DistributedError: [all_gather_object] rank 1's object cannot be serialized (see its error)");
    if (rank === 0) {
      assert.match(String(res.wait_timeout), /^DistributedTimeoutError: \[irecv\] wait timed out after 150 ms/);
      assert.ok((res.wait_timeout_ms as number) >= 150 && (res.wait_timeout_ms as number) < 2000, `wait(150) took ${String(res.wait_timeout_ms)} ms`);
      assert.deepEqual(res.wait_after_timeout, [true, [4, 2]]);
    }
    const mbLast = (run.results[world - 1]!.monitored_barrier as { arrived: number }).arrived;
    const mb = res.monitored_barrier as { arrived: number; left: number };
    assert.ok(mb.left >= mbLast - 2, `rank ${rank} left the monitored barrier at ${mb.left}, before the last rank arrived at ${mbLast}`);
    if (rank < 2) {
      assert.equal(res.subgroup_rank, rank);
      assert.equal(res.subgroup_size, 2);
      assert.deepEqual(res.subgroup_sum, [3]);
    } else {
      assert.equal(res.subgroup_rank, -1);
      assert.equal(res.subgroup_size, -1, "torch's get_world_size(group) on a non-member is -1");
      assert.match(String(res.subgroup_error), /^DistributedError: \[all_reduce\] rank 2 is not a member of the group \[0, 1\]/);
    }
  }
}

const noIpv6Loopback = Object.values(networkInterfaces()).flat().some((a) => a?.address === "::1") ? false : "no IPv6 loopback (::1) here";

async function freePortOn(host: string): Promise<number> {
  return new Promise((resolve) => {
    const srv = createServer().listen(0, host, () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

describe("collectives across processes", { skip: skipWithoutGloo, timeout: 60_000 }, () => {
  it("2 ranks, env:// rendezvous (TCP store on rank 0)", async () => {
    const run = await runRanks("collectives-worker", 2);
    checkRun(run, 2);
    cleanup(run);
  });

  it("3 ranks, env:// (subgroup [0, 1] with a non-member)", async () => {
    const run = await runRanks("collectives-worker", 3);
    checkRun(run, 3);
    cleanup(run);
  });

  // torch's TCPStore and gloo take IPv6: the store, its clients and gloo's pairs all on ::1
  it("2 ranks over IPv6 loopback, env:// with MASTER_ADDR=::1", { skip: noIpv6Loopback }, async () => {
    const run = await runRanks("collectives-worker", 2, [], { masterAddr: "::1" });
    checkRun(run, 2);
    cleanup(run);
  });

  it("3 ranks over IPv6 loopback, tcp://[::1]:port", { skip: noIpv6Loopback }, async () => {
    const port = await freePortOn("::1");
    const run = await runRanks("collectives-worker", 3, [`tcp://[::1]:${port}`], { masterAddr: "::1", masterPort: port });
    checkRun(run, 3);
    cleanup(run);
  });

  it("2 ranks, file:// rendezvous (gloo's FileStore)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-dist-filestore-"));
    const run = await runRanks("collectives-worker", 2, [`file://${dir}`]);
    checkRun(run, 2);
    cleanup(run);
    rmSync(dir, { recursive: true, force: true });
  });
});
