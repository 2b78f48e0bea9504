// compile() benchmark: eager vs compiled for a fused elementwise chain on 1M elements and a tiny gated
// MLP, cold (C compiler) vs warm (disk cache) program build time, in-process and in fresh child
// processes, a SmolLM-135M-shaped decode step in strict vs defer-and-fuse eager mode, and its paged (serving)
// form eager vs compile(model.forward).
// Run: npx tsc -p . && node dist/bench/compile.js   (KILN_BENCH_DECODE=0 skips the 135M-parameter model)
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k from "../src/tensor/index.js";
import { compile, compileCacheStats, jitUnavailableReason, linear, rmsNorm, siluMul } from "../src/compile/index.js";
import { forgetLoaded } from "../src/compile/cache.js";
import { CausalLM } from "../src/models/causal-lm.js";
import { parseHfConfig } from "../src/models/hf-config.js";
import { PRESETS } from "../src/models/init-model.js";

const STARTUP_CHILD = process.argv.includes("--startup-child");
if (!STARTUP_CHILD) process.env.KILN_CACHE_DIR = mkdtempSync(join(tmpdir(), "kiln-bench-compile-"));

type T = any; // eslint-disable-line @typescript-eslint/no-explicit-any -- runs on Tensor and Sym alike
const chain = (x: T, y: T): T => x.mul(1.5).add(y).sub(0.25).tanh().mul(x).add(1).relu().mul(0.5).sigmoid();
const mlp = (x: T, wg: T, wu: T, wd: T, wn: T): T => linear(siluMul(linear(rmsNorm(x, wn, 1e-5), wg), linear(rmsNorm(x, wn, 1e-5), wu)), wd).add(x);

function time(fn: () => k.Tensor, iters: number): number {
  fn().dispose();
  const t0 = performance.now();
  for (let i = 0; i < iters; i++) {
    const out = fn();
    out.dataSync();
    out.dispose();
  }
  return (performance.now() - t0) / iters;
}

function disposeAll(f: () => k.Tensor): () => k.Tensor {
  return f;
}

/** Child mode: compile + first run of a decoder-MLP-sized block in this fresh process; prints ms and cache stats. */
function startupChild(): void {
  const t0 = performance.now();
  const Dm = 576;
  const Fm = 1536;
  const g = new k.Generator(1);
  const w = (shape: number[]) => k.randn(shape, { std: 0.02, generator: g });
  const [wgm, wum, wdm, wnm] = [w([Fm, Dm]), w([Fm, Dm]), w([Dm, Fm]), w([Dm])];
  const block = compile((a) => mlp(a, wgm, wum, wdm, wnm), { dynamic: { argIndex: 0, dim: 0, max: 64 } });
  const tBuild = performance.now();
  const out = block(w([4, Dm])) as k.Tensor;
  out.dataSync();
  const ms = performance.now() - tBuild;
  process.stdout.write(JSON.stringify({ ms, setupMs: tBuild - t0, cache: compileCacheStats() }) + "\n");
}

if (STARTUP_CHILD) {
  startupChild();
  process.exit(0);
}

const N = 1 << 20;
const x = k.randn([N]);
const y = k.randn([N]);
console.log(`device: ${k.defaultDevice().backend.describe()}; jit: ${jitUnavailableReason() ?? "available"}`);
const chainC = compile((a, b) => chain(a, b));
const tCold0 = performance.now();
chainC(x, y);
const coldMs = performance.now() - tCold0;
const eagerChain = time(disposeAll(() => chain(x, y)), 10);
const compiledChain = time(() => chainC(x, y) as k.Tensor, 10);
console.log(`elementwise chain (9 ops, 1M f32): eager ${eagerChain.toFixed(2)} ms, compiled ${compiledChain.toFixed(2)} ms (${(eagerChain / compiledChain).toFixed(1)}x), fused kernels ${chainC.lastInfo?.fusedKernels}`);

const D = 256;
const F = 512;
const xs = k.randn([8, D]);
const wg = k.randn([F, D]).mul(0.05);
const wu = k.randn([F, D]).mul(0.05);
const wd = k.randn([D, F]).mul(0.05);
const wn = k.randn([D]);
const mlpC = compile((a) => mlp(a, wg, wu, wd, wn));
mlpC(xs);
const eagerMlp = time(() => mlp(xs, wg, wu, wd, wn), 50);
const compiledMlp = time(() => mlpC(xs) as k.Tensor, 50);
const info = mlpC.lastInfo!;
console.log(`tiny MLP [8x${D}] -> ${F} -> ${D}: eager ${eagerMlp.toFixed(3)} ms, compiled ${compiledMlp.toFixed(3)} ms (${(eagerMlp / compiledMlp).toFixed(2)}x); ${info.fusedKernels} fused + ${info.opaqueKernels} back-end kernels, arena ${info.arenaBytes} B (unplanned ${info.naiveBytes} B)`);

// warm: a new compile() of the same function in a "fresh process" (loaded libraries forgotten) hits the disk cache
forgetLoaded();
const warm = compile((a, b) => chain(a, b));
const tWarm0 = performance.now();
warm(x, y);
const warmMs = performance.now() - tWarm0;
console.log(`program build incl. first run: cold ${coldMs.toFixed(1)} ms (C compile ${compileCacheStats().compileMs.toFixed(1)} ms total), warm from disk cache ${warmMs.toFixed(1)} ms; cache ${JSON.stringify(compileCacheStats())}`);

// cold vs warm start-up in fresh processes: compile + first run with an empty cache dir, then with the
// directory the cold run populated (nothing loaded in-process: the real start-up of a served model)
{
  const self = new URL(import.meta.url).pathname;
  const runChild = (dir: string) => {
    const t0 = performance.now();
    const r = spawnSync(process.execPath, [self, "--startup-child"], { env: { ...process.env, KILN_CACHE_DIR: dir }, encoding: "utf8" });
    const wallMs = performance.now() - t0;
    if (r.status !== 0) throw new Error(`startup child failed: ${r.stderr}`);
    const res = JSON.parse(r.stdout.trim().split("\n").pop()!) as { ms: number; cache: { hits: number; misses: number } };
    return { ...res, wallMs };
  };
  const cold: number[] = [];
  const warm: number[] = [];
  const coldWall: number[] = [];
  const warmWall: number[] = [];
  for (let i = 0; i < 3; i++) {
    const dir = mkdtempSync(join(tmpdir(), "kiln-bench-startup-"));
    const c = runChild(dir);
    const w = runChild(dir);
    if (c.cache.misses === 0 || w.cache.misses !== 0) throw new Error(`unexpected cache behaviour: cold ${JSON.stringify(c.cache)}, warm ${JSON.stringify(w.cache)}`);
    cold.push(c.ms);
    warm.push(w.ms);
    coldWall.push(c.wallMs);
    warmWall.push(w.wallMs);
    rmSync(dir, { recursive: true, force: true });
  }
  const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
  console.log(
    `fresh-process start-up, MLP block [576 -> 1536 -> 576] compile + first run (median of 3): cold ${med(cold).toFixed(1)} ms, warm ${med(warm).toFixed(1)} ms ` +
      `(${(med(cold) / med(warm)).toFixed(1)}x); whole child process cold ${med(coldWall).toFixed(0)} ms, warm ${med(warmWall).toFixed(0)} ms (${(med(coldWall) / med(warmWall)).toFixed(2)}x)`,
  );
}

// a SmolLM-135M-shaped decode step (batch 1, one token, dense context: the per-layer elementwise work of a
// step without KV history) in strict vs defer-and-fuse eager mode; final hidden states read back each step
if (process.env.KILN_BENCH_DECODE !== "0") {
  const cfg = parseHfConfig({ architectures: ["LlamaForCausalLM"], ...PRESETS["smollm-135m"] });
  const model = new CausalLM(cfg, { unallocatedParameters: true }); // every parameter is set below
  const g = new k.Generator(3);
  for (const [n, p] of model.namedParameters()) {
    model.setParameter(n, n.endsWith("norm.weight") ? k.ones(p.shape) : k.randn(p.shape, { std: 0.02, generator: g }));
  }
  const ids = k.tensor(Int32Array.from([17]));
  const positions = k.tensor(Int32Array.from([0]));
  const step = () =>
    k.noGrad(() => {
      const h = model.forward(ids, { kind: "dense", batch: 1, seqLen: 1, positions });
      h.dataSync();
      return h;
    });
  // rounds alternate between the modes (the machine may be shared): medians of 7 rounds of 10 steps each
  const round = (mode: k.EagerMode) =>
    k.withEagerMode(mode, () => {
      const iters = 10;
      const kernels0 = k.kernelsDispatched();
      const t0 = performance.now();
      let last: number[] = [];
      for (let i = 0; i < iters; i++) {
        const h = step();
        if (i === iters - 1) last = h.toList();
        h.dispose();
      }
      return { ms: (performance.now() - t0) / iters, kernels: (k.kernelsDispatched() - kernels0) / iters, last };
    });
  for (const mode of ["strict", "defer-and-fuse"] as const) k.withEagerMode(mode, () => step().dispose()); // deferred programs are built here
  const rounds: Record<"strict" | "defer-and-fuse", ReturnType<typeof round>[]> = { strict: [], "defer-and-fuse": [] };
  for (let r = 0; r < 7; r++) for (const mode of ["strict", "defer-and-fuse"] as const) rounds[mode].push(round(mode));
  const median = (rs: ReturnType<typeof round>[]) => ({ ...rs[0]!, ms: rs.map((x) => x.ms).sort((a, b) => a - b)[rs.length >> 1]! });
  const strict = median(rounds.strict);
  const deferred = median(rounds["defer-and-fuse"]);
  let maxDiff = 0;
  strict.last.forEach((v, i) => (maxDiff = Math.max(maxDiff, Math.abs(v - deferred.last[i]!))));
  console.log(
    `SmolLM-135M-shaped decode step (30 layers, hidden 576, f32, batch 1 x 1 token, no lm_head): strict ${strict.ms.toFixed(2)} ms / ${strict.kernels} kernels, ` +
      `defer-and-fuse ${deferred.ms.toFixed(2)} ms / ${deferred.kernels} kernels per step (${(strict.ms / deferred.ms).toFixed(2)}x); max |diff| ${maxDiff.toExponential(1)}`,
  );

  // the serving path: a paged decode step (one sequence, 32 cached positions) eager vs compile(model.forward)
  // (dispatch capture: the whole forward, paged attention included, as one program of segments and kernels)
  const BS = 16;
  const kv = model.model.layers.map(() => ({
    k: k.zeros([4, BS, cfg.numKeyValueHeads, cfg.headDim]),
    v: k.zeros([4, BS, cfg.numKeyValueHeads, cfg.headDim]),
  }));
  const pos = 32;
  const meta = {
    positions: k.tensor(Int32Array.of(pos)),
    slotMapping: k.tensor(Int32Array.of(3 * BS + (pos % BS))),
    blockTables: k.tensor(Int32Array.of(1, 2, 3), { shape: [1, 3] }),
    queryStart: k.tensor(Int32Array.of(0, 1)),
    seqLens: k.tensor(Int32Array.of(pos + 1)),
  };
  const paged = (x: k.Tensor, p: k.Tensor, s: k.Tensor, bt: k.Tensor, qs: k.Tensor, sl: k.Tensor) =>
    model.forward(x, { kind: "paged", positions: p, slotMapping: s, blockTables: bt, queryStart: qs, seqLens: sl, kvCaches: kv });
  const compiled = compile(paged, { dynamic: [0, 1, 2].map((argIndex) => ({ argIndex, dim: 0, max: 256 })), name: "smollm-forward" });
  const args = [ids, meta.positions, meta.slotMapping, meta.blockTables, meta.queryStart, meta.seqLens] as const;
  const pagedStep = (f: typeof paged) => k.noGrad(() => f(...args));
  const runs: Record<"eager" | "compiled", number[]> = { eager: [], compiled: [] };
  const fns = { eager: paged, compiled: compiled as unknown as typeof paged };
  for (const f of Object.values(fns)) pagedStep(f).dispose(); // builds the program
  for (let r = 0; r < 7; r++) {
    for (const name of ["eager", "compiled"] as const) {
      const t0 = performance.now();
      for (let i = 0; i < 10; i++) {
        const h = pagedStep(fns[name]);
        h.dataSync();
        h.dispose();
      }
      runs[name].push((performance.now() - t0) / 10);
    }
  }
  const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
  const info = compiled.lastInfo!;
  console.log(
    `paged decode step (same model, 32 cached positions), strict mode: eager ${med(runs.eager).toFixed(2)} ms, compile(model.forward) ${med(runs.compiled).toFixed(2)} ms ` +
      `(${(med(runs.eager) / med(runs.compiled)).toFixed(2)}x); ${info.fusedKernels} fused + ${info.opaqueKernels} back-end kernels in ${info.segments} segments`,
  );
}
