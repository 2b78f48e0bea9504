// Wrong use of the process group and collectives ends in typed errors naming the op: locally detectable mistakes in
// this process (world of one, no peer needed), cross-rank mismatches and timeouts with real processes.
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { describe, it } from "node:test";
import * as dist from "../../src/distributed/index.js";
import { tensor, zeros } from "../../src/tensor/index.js";
import { DistributedError, DistributedTimeoutError } from "../../src/distributed/index.js";
import { UnsupportedError } from "../../src/util/errors.js";
import { cleanup, runRanks, skipWithoutGloo } from "./run-ranks.js";

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const srv = createServer().listen(0, "127.0.0.1", () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

function throwsTyped(fn: () => unknown, type: new (...a: never[]) => Error, message: RegExp): void {
  assert.throws(fn, (err: Error) => {
    assert.ok(err instanceof type, `expected ${type.name}, got ${err.name}: ${err.message}`);
    assert.match(err.message, message);
    return true;
  });
}

describe("process group misuse in one process", () => {
  it("collectives and queries before initProcessGroup name the op", () => {
    assert.equal(dist.isInitialized(), false);
    throwsTyped(() => dist.allReduce(tensor([1])), DistributedError, /^\[all_reduce\] the default process group is not initialized/);
    throwsTyped(() => dist.barrier(), DistributedError, /^\[barrier\] .*not initialized/);
    throwsTyped(() => dist.getRank(), DistributedError, /^\[get_rank\] .*not initialized/);
    throwsTyped(() => dist.newGroup([0]), DistributedError, /^\[new_group\] .*not initialized/);
    throwsTyped(() => dist.getBackend(), DistributedError, /^\[get_backend\] .*not initialized/);
    throwsTyped(() => dist.allGatherObject([null], 1), DistributedError, /^\[all_gather_object\] .*not initialized/);
    throwsTyped(() => dist.monitoredBarrier(), DistributedError, /^\[monitored_barrier\] .*not initialized/);
  });

  it("bad init arguments", () => {
    throwsTyped(() => dist.initProcessGroup({ initMethod: "tcp://127.0.0.1:1", worldSize: 2 }), DistributedError, /^\[init_process_group\] tcp:\/\/127.0.0.1:1 needs the rank option/);
    throwsTyped(() => dist.initProcessGroup({ initMethod: "tcp://127.0.0.1:1", rank: 2, worldSize: 2 }), DistributedError, /rank 2 is out of range for a world of 2 ranks/);
    throwsTyped(() => dist.initProcessGroup({ initMethod: "udp://x", rank: 0, worldSize: 1 }), DistributedError, /unknown init method udp:\/\/x/);
    throwsTyped(() => dist.initProcessGroup({ backend: "nccl" as "gloo", initMethod: "tcp://127.0.0.1:1", rank: 0, worldSize: 1 }), DistributedError, /back end "nccl" is not supported/);
    // the addon reads the timeout as whole milliseconds: Infinity became 0 (every wait timed out at once), 0.5 too
    for (const timeoutMs of [Infinity, NaN, 0.5, -1, 2 ** 60])
      throwsTyped(() => dist.initProcessGroup({ initMethod: "tcp://127.0.0.1:1", rank: 0, worldSize: 1, timeoutMs }), DistributedError, /^\[init_process_group\] timeoutMs must be a number of milliseconds in \[1, 2\^40\]/);
    assert.equal(dist.isInitialized(), false);
  });

  it("a world of one: collectives are local no-ops, wrong ranks and dtypes are refused", () => {
    dist.initProcessGroup({ initMethod: "tcp://127.0.0.1:1", rank: 0, worldSize: 1 });
    try {
      assert.equal(dist.getRank(), 0);
      assert.equal(dist.getWorldSize(), 1);
      const t = tensor([1.5, -2]);
      dist.allReduce(t, "avg");
      assert.deepEqual(t.toList(), [1.5, -2]);
      dist.broadcast(t, 0);
      const out = [zeros([2])];
      dist.allGather(out, t);
      assert.deepEqual(out[0]!.toList(), [1.5, -2]);
      const into = zeros([2]);
      dist.reduceScatterTensor(into, tensor([3, 4]));
      assert.deepEqual(into.toList(), [3, 4]);
      dist.barrier();
      throwsTyped(() => dist.broadcast(t, 1), DistributedError, /^\[broadcast\] src rank 1 is out of range for a world of 1 ranks/);
      throwsTyped(() => dist.send(t, 0), DistributedError, /^\[send\] dst rank 0 is this rank/);
      throwsTyped(() => dist.recv(t, -1), DistributedError, /^\[recv\] src rank -1 is out of range/);
      throwsTyped(() => dist.allGather([zeros([2]), zeros([2])], t), DistributedError, /^\[all_gather\] outList has 2 tensors for a group of 1 ranks/);
      throwsTyped(() => dist.allGather([zeros([3])], t), DistributedError, /^\[all_gather\] outList\[0\] has shape \[3\] but the tensor has \[2\]/);
      throwsTyped(() => dist.allGather([zeros([2], { dtype: "int32" })], t), DistributedError, /outList\[0\] is int32 but the tensor is float32/);
      throwsTyped(() => dist.allGatherIntoTensor(zeros([3]), t), DistributedError, /^\[all_gather_into_tensor\] output has 3 elements; a group of 1 ranks gathering 2 needs 2/);
      throwsTyped(() => dist.allReduce(zeros([2], { dtype: "uint8" })), UnsupportedError, /^\[all_reduce\] uint8 reductions are not supported/);
      throwsTyped(() => dist.allReduce(zeros([2], { dtype: "int32" }), "avg"), UnsupportedError, /^\[all_reduce\] avg of int32 would truncate/);
      throwsTyped(() => dist.allReduce(t, "mean" as "avg"), DistributedError, /unknown reduce op "mean"/);
      throwsTyped(() => dist.send(t, 0, undefined, -1), DistributedError, /^\[send\] tag must be an integer/);
      throwsTyped(() => dist.newGroup([0, 3]), DistributedError, /^\[new_group\] rank 3 is out of range for a world of 1 ranks/);
      throwsTyped(() => dist.initProcessGroup({ initMethod: "tcp://127.0.0.1:1", rank: 0, worldSize: 1 }), DistributedError, /already initialized/);
      // bitwise ops take integer tensors only, as torch's
      throwsTyped(() => dist.allReduce(t, dist.ReduceOp.BAND), UnsupportedError, /^\[all_reduce\] band needs an integer tensor \(int32, int64\), got float32/);
      throwsTyped(() => dist.allReduce(zeros([2], { dtype: "bfloat16" }), "bxor"), UnsupportedError, /^\[all_reduce\] bxor needs an integer tensor/);
      throwsTyped(() => dist.reduceScatterTensor(zeros([2]), zeros([2]), "bor"), UnsupportedError, /^\[reduce_scatter_tensor\] bor needs an integer tensor/);
      const ints = tensor([6, 3], { dtype: "int64" });
      dist.allReduce(ints, dist.ReduceOp.BXOR);
      assert.deepEqual(ints.toList(), [6, 3]);
      // reduce / gather / scatter / all_to_all: wrong ranks, lists, sizes and dtypes
      throwsTyped(() => dist.reduce(t, 1), DistributedError, /^\[reduce\] dst rank 1 is out of range for a world of 1 ranks/);
      throwsTyped(() => dist.reduce(t, 0, "bor"), UnsupportedError, /^\[reduce\] bor needs an integer tensor/);
      throwsTyped(() => dist.gather(t, null, 0), DistributedError, /^\[gather\] gatherList must be given on the destination rank/);
      throwsTyped(() => dist.gather(t, [zeros([3])], 0), DistributedError, /^\[gather\] gatherList\[0\] has shape \[3\] but the tensor has \[2\]/);
      throwsTyped(() => dist.scatter(t, [], 0), DistributedError, /^\[scatter\] scatterList must be given on the source rank/);
      throwsTyped(() => dist.scatter(t, [t], 2), DistributedError, /^\[scatter\] src rank 2 is out of range/);
      throwsTyped(() => dist.allToAll([zeros([2])], [t, t]), DistributedError, /^\[all_to_all\] inputList has 2 tensors for a group of 1 ranks/);
      throwsTyped(() => dist.allToAllSingle(zeros([3]), t), DistributedError, /^\[all_to_all_single\] rank 0 sends 2 elements to rank 0, which expects 3/);
      throwsTyped(() => dist.allToAllSingle(zeros([2]), t, [1]), DistributedError, /^\[all_to_all_single\] output split sizes \[1\] add up to 1, but it has 2 rows/);
      throwsTyped(() => dist.allToAllSingle(zeros([2, 2]), zeros([2, 3])), DistributedError, /^\[all_to_all_single\] output rows \[2\] differ from the input's \[3\]/);
      dist.reduce(ints, 0, dist.ReduceOp.BOR);
      const scattered = zeros([2]);
      dist.scatter(scattered, [tensor([5, 6])], 0);
      const a2a = [zeros([2])];
      dist.allToAll(a2a, [tensor([7, 8])]);
      assert.deepEqual([ints.toList(), scattered.toList(), a2a[0]!.toList()], [[6, 3], [5, 6], [7, 8]]);
      // isend / irecv check their peer as send / recv do; asyncOp returns a completed Work
      throwsTyped(() => dist.isend(t, 0), DistributedError, /^\[isend\] dst rank 0 is this rank/);
      throwsTyped(() => dist.irecv(t, 1), DistributedError, /^\[irecv\] src rank 1 is out of range/);
      const work = dist.allReduce(t, "sum", undefined, true);
      assert.ok(work instanceof dist.Work);
      assert.deepEqual([work.isCompleted(), work.wait(), dist.barrier(undefined, true).wait()], [true, true, true]);
      throwsTyped(() => dist.newGroup([0], { timeoutMs: 0 }), DistributedError, /^\[new_group\] timeoutMs must be a number of milliseconds in \[1, 2\^40\], got 0/);
      // torch.distributed's helpers in a world of one
      assert.deepEqual([dist.getBackend(), dist.getProcessGroupRanks(dist.newGroup())], ["gloo", [0]]);
      dist.monitoredBarrier(undefined, 100, true);
      throwsTyped(() => dist.monitoredBarrier(undefined, -1), DistributedError, /^\[monitored_barrier\] timeoutMs must be a number of milliseconds in \[0, 2\^40\], got -1/);
      throwsTyped(() => work.wait(NaN), DistributedError, /^\[wait\] wait's timeoutMs must be a number of milliseconds/);
      assert.equal(work.wait(0), true);
      // the last tag is monitoredBarrier's
      throwsTyped(() => dist.send(t, 0, undefined, 2 ** 32 - 1), DistributedError, /^\[send\] tag must be an integer in \[0, 2\^32 - 1\), got 4294967295 \(2\^32 - 1 is monitored_barrier's\)/);
      const objs: unknown[] = [null];
      dist.allGatherObject(objs, { a: [1, new Date(0)] });
      assert.deepEqual(objs, [{ a: [1, new Date(0)] }]);
      const listed: unknown[] = [1, "two"];
      dist.broadcastObjectList(listed, 0);
      assert.deepEqual(listed, [1, "two"]);
      const gatheredObj: unknown[] = [null];
      dist.gatherObject(new Map([[1, 2]]), gatheredObj, 0);
      assert.deepEqual(gatheredObj, [new Map([[1, 2]])]);
      const scatteredObj: unknown[] = [null];
      dist.scatterObjectList(scatteredObj, ["mine"], 0);
      assert.deepEqual(scatteredObj, ["mine"]);
      throwsTyped(() => dist.allGatherObject([], 1), DistributedError, /^\[all_gather_object\] objectList must be an array of 1 entries \(one per rank of the group\), got 0 entries/);
      throwsTyped(() => dist.allGatherObject([null], { t }), DistributedError, /^\[all_gather_object\] obj.t is a Tensor instance, which would arrive as a plain object: send plain data/);
      throwsTyped(() => dist.allGatherObject([null], [Symbol("s")]), DistributedError, /^\[all_gather_object\] obj\[0\] is a symbol, which cannot be sent/);
      throwsTyped(() => dist.broadcastObjectList([new (class Point {})()], 0), DistributedError, /^\[broadcast_object_list\] objectList\[0\] is a Point instance/);
      throwsTyped(() => dist.broadcastObjectList([1], 1), DistributedError, /^\[broadcast_object_list\] src rank 1 is out of range for a world of 1 ranks/);
      throwsTyped(() => dist.gatherObject(1, null, 0), DistributedError, /^\[gather_object\] objectGatherList must be an array of 1 entries/);
      throwsTyped(() => dist.scatterObjectList([], ["x"], 0), DistributedError, /^\[scatter_object_list\] scatterObjectOutputList must be a non-empty array/);
      throwsTyped(() => dist.scatterObjectList([null], ["x", "y"], 0), DistributedError, /^\[scatter_object_list\] scatterObjectInputList must be an array of 1 entries/);
      const g = dist.newGroup([0]);
      dist.destroyProcessGroup(g);
      throwsTyped(() => dist.getBackend(g), DistributedError, /^\[get_backend\] the group \[0\] was destroyed/);
      throwsTyped(() => dist.allReduce(t, "sum", g), DistributedError, /^\[all_reduce\] the group \[0\] was destroyed/);
    } finally {
      dist.destroyProcessGroup();
    }
    assert.equal(dist.isInitialized(), false);
  });
});

describe("rendezvous and collective timeouts", { skip: skipWithoutGloo, timeout: 60_000 }, () => {
  it("rank 0 whose peer never joins gets DistributedTimeoutError from init_process_group", async () => {
    const port = await freePort();
    const start = Date.now();
    throwsTyped(
      () => dist.initProcessGroup({ initMethod: `tcp://127.0.0.1:${port}`, rank: 0, worldSize: 2, timeoutMs: 700 }),
      DistributedTimeoutError,
      /^\[init_process_group\] timed out after 700 ms: .*did not appear in the store/,
    );
    assert.ok(Date.now() - start < 5000, `took ${Date.now() - start} ms`);
    assert.equal(dist.isInitialized(), false);
  });

  it("rank 1 whose store never comes up gets DistributedTimeoutError", async () => {
    const port = await freePort();
    throwsTyped(
      () => dist.initProcessGroup({ initMethod: `tcp://127.0.0.1:${port}`, rank: 1, worldSize: 2, timeoutMs: 500 }),
      DistributedTimeoutError,
      /could not reach the store at 127.0.0.1:\d+ within 500 ms/,
    );
    assert.equal(dist.isInitialized(), false);
  });

  it("cross-rank dtype/size/op mismatches and a collective one rank never joins (2 processes)", async () => {
    const run = await runRanks("misuse-worker", 2);
    assert.equal(run.exitCode, 0, run.log.join("\n"));
    for (const [rank, res] of run.results.entries()) {
      assert.ok(res, `rank ${rank} wrote no result`);
      assert.match(String(res.init_twice), /^DistributedError: \[init_process_group\] the default process group is already initialized/);
      assert.match(String(res.dtype_mismatch), /^DistributedError: \[all_reduce\] ranks disagree: .*float32 x 4.*int32 x 4|^DistributedError: \[all_reduce\] ranks disagree: .*int32 x 4.*float32 x 4/);
      assert.match(String(res.numel_mismatch), /^DistributedError: \[all_reduce\] ranks disagree: .*float32 x [45].*float32 x [45]/);
      assert.match(String(res.op_mismatch), rank === 0 ? /^DistributedError: \[all_reduce\] ranks disagree: .* called all_reduce.* called broadcast/ : /^DistributedError: \[broadcast\] ranks disagree: .* called broadcast.* called all_reduce/);
      assert.match(String(res.src_mismatch), /^DistributedError: \[broadcast\] ranks disagree/);
      assert.equal(res.all_to_all_mismatch, "DistributedError: [all_to_all_single] rank 0 sends 1 elements to rank 1, which expects 2");
      assert.equal(res.reduce_dst_mismatch, rank === 0
        ? "DistributedError: [reduce] ranks disagree: group rank 0 called reduce(float32 x 2, max, dst 0) but group rank 1 called reduce(float32 x 2, max, dst 1)"
        : "DistributedError: [reduce] ranks disagree: group rank 1 called reduce(float32 x 2, max, dst 1) but group rank 0 called reduce(float32 x 2, max, dst 0)");
      assert.equal(res.gather_list, rank === 0
        ? "DistributedError: [gather] gatherList must be given on the destination rank"
        : "DistributedError: [gather] gatherList must not be given on a rank other than the destination");
      assert.equal(res.object_list_mismatch, rank === 0
        ? "DistributedError: [broadcast_object_list] ranks disagree: group rank 0 called broadcast_object_list(2 objects, src 0) but group rank 1 called broadcast_object_list(3 objects, src 0)"
        : "DistributedError: [broadcast_object_list] ranks disagree: group rank 1 called broadcast_object_list(3 objects, src 0) but group rank 0 called broadcast_object_list(2 objects, src 0)");
      assert.equal(res.object_src_refused, rank === 0
        ? "DistributedError: [broadcast_object_list] objectList[1] is a function, which cannot be sent (objects travel as structured clones)"
        : "DistributedError: [broadcast_object_list] rank 0's object cannot be serialized (see its error)");
      assert.deepEqual(res.after_mismatch, [2, 25]);
      if (rank === 1) {
        assert.equal(res.recv_longer, "DistributedError: [recv] rank 0 sent float32 x 3 (tag 0) but this rank receives into float32 x 2");
        assert.equal(res.recv_shorter, "DistributedError: [recv] rank 0 sent float32 x 1 (tag 3) but this rank receives into float32 x 2");
        assert.equal(res.recv_dtype, "DistributedError: [recv] rank 0 sent int32 x 2 (tag 0) but this rank receives into float32 x 2");
        assert.deepEqual(res.recv_untouched, [7, 7]);
        assert.deepEqual(res.recv_after_values, [4, 5]);
        assert.equal(res.irecv_longer, "DistributedError: [irecv] rank 0 sent float32 x 3 (tag 0) but this rank receives into float32 x 2");
        assert.deepEqual(res.irecv_untouched, [7, 7]);
        assert.equal(res.irecv_after, null);
        assert.deepEqual(res.irecv_after_values, [8, 9]);
      } else {
        for (const key of ["recv_longer", "recv_shorter", "recv_dtype", "recv_after", "irecv_longer", "irecv_after"]) assert.equal(res[key], null, `${key} on the sender`);
      }
    }
    const r1 = run.results[1]!;
    assert.match(String(r1.timeout), /^DistributedTimeoutError: \[all_reduce\] timed out after 1500 ms/);
    assert.ok((r1.timeout_ms as number) >= 1400 && (r1.timeout_ms as number) < 6000, `timed out after ${String(r1.timeout_ms)} ms`);
    cleanup(run);
  });

  it("monitoredBarrier: rank 0 names the ranks that did not arrive in time (3 processes)", async () => {
    const run = await runRanks("monitored-barrier-worker", 3);
    assert.equal(run.exitCode, 0, run.log.join("\n"));
    const [r0, ...late] = run.results;
    assert.equal(r0!.wait_all_false, "DistributedTimeoutError: [monitored_barrier] Rank 1 failed to pass monitoredBarrier in 200 ms");
    assert.equal(r0!.wait_all_true, "DistributedTimeoutError: [monitored_barrier] Ranks 1, 2 failed to pass monitoredBarrier in 200 ms");
    for (const key of ["wait_all_false_ms", "wait_all_true_ms"]) assert.ok((r0![key] as number) >= 200 && (r0![key] as number) < 2000, `${key}: ${String(r0![key])}`);
    for (const [i, res] of late.entries())
      for (const key of ["wait_all_false", "wait_all_true"])
        assert.match(String(res![key]), new RegExp(`^DistributedTimeoutError: \\[monitored_barrier\\] rank ${i + 1} reached the barrier but rank 0 did not release it .*timed out after 700 ms`));
    cleanup(run);
  });

  it("a peer that exited fails the next collective with DistributedBackendError, before the timeout", async () => {
    const run = await runRanks("misuse-worker", 2, ["peer-exit"]);
    assert.equal(run.exitCode, 0, run.log.join("\n"));
    const r1 = run.results[1]!;
    assert.match(String(r1.peer_exit), /^DistributedBackendError: \[all_reduce\] .*(Connection closed by peer|Connection reset|Broken pipe)/);
    assert.ok((r1.peer_exit_ms as number) < 1400, `failed after ${String(r1.peer_exit_ms)} ms`);
    cleanup(run);
  });
});
