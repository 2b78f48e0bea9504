// All-reduce, broadcast and all-gather time and bandwidth on float32 tensors across the ranks of `kiln run`:
//   node bin/kiln run --nproc-per-node 2 dist/bench/distributed.js [--no-checks]
// Reports, per size, the median of the iterations on rank 0: algorithm bandwidth (bytes / time) and, for all-reduce,
// NCCL's bus bandwidth (algbw * 2 (n-1) / n, the bytes each rank moves), both through the Tensor API (which adds
// the cross-rank consistency check, unless --no-checks) and on a raw typed array straight into the addon.
import * as dist from "../src/distributed/index.js";
import { loadGloo, type NativeHandle } from "../src/distributed/gloo-native.js";
import { tensor } from "../src/tensor/index.js";

const checks = !process.argv.includes("--no-checks");
dist.initProcessGroup({ backend: "gloo", consistencyChecks: checks });
const rank = dist.getRank();
const world = dist.getWorldSize();
const native = loadGloo();
const handle = (dist.newGroup() as unknown as { handle: NativeHandle }).handle; // a second full mesh for the raw calls

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function time(iters: number, fn: () => void): number {
  fn(); // warm-up
  const ts: number[] = [];
  for (let i = 0; i < iters; i++) {
    dist.barrier();
    const t0 = performance.now();
    fn();
    ts.push(performance.now() - t0);
  }
  return median(ts) / 1000;
}

const rows: string[] = [];
for (const elements of [256, 16_384, 262_144, 1_048_576, 4_194_304, 16_777_216]) {
  const bytes = elements * 4;
  const iters = bytes >= 16 << 20 ? 5 : 20;
  const t = tensor(new Float32Array(elements).fill(rank + 1));
  const raw = new Float32Array(elements).fill(rank + 1);
  const ar = time(iters, () => dist.allReduce(t));
  const arRaw = time(iters, () => native.allreduce(handle, raw, 0, 0));
  const bc = time(iters, () => dist.broadcast(t, 0));
  const out = tensor(new Float32Array(elements * world));
  const ag = time(iters, () => dist.allGatherIntoTensor(out, t));
  const gb = (s: number, b = bytes) => ((b / s) / 1e9).toFixed(2);
  const bus = (2 * (world - 1)) / world;
  rows.push(
    `${(bytes / 1024).toFixed(0).padStart(8)} KiB  all_reduce ${(ar * 1e3).toFixed(3).padStart(8)} ms ` +
      `algbw ${gb(ar).padStart(6)} GB/s busbw ${((bytes * bus) / ar / 1e9).toFixed(2).padStart(6)} GB/s | raw ${(arRaw * 1e3).toFixed(3).padStart(8)} ms ` +
      `busbw ${((bytes * bus) / arRaw / 1e9).toFixed(2).padStart(6)} GB/s | broadcast ${gb(bc).padStart(6)} GB/s | all_gather out ${gb(ag, bytes * world).padStart(6)} GB/s`,
  );
  t.dispose();
  out.dispose();
}
if (rank === 0) console.log(`gloo over tcp (127.0.0.1), ${world} ranks, float32, consistency checks ${checks ? "on" : "off"}, median per call\n${rows.join("\n")}`);
dist.destroyProcessGroup();
