// The native in-order stream (native/stream.cc): enqueue variants equal the synchronous kernels, run in
// order, validate at submit, and neither hang nor crash a process or a worker_threads Worker at exit.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";

const k = tryLoadNativeKernels();
const skip = !k && "native kernels not built";
const addonPath = fileURLToPath(new URL("../../../build/Release/kiln_native.node", import.meta.url));

let seed = 12345;
const rand = (n: number): Float32Array => Float32Array.from({ length: n }, () => {
  seed = (seed * 1103515245 + 12345) >>> 0;
  return seed / 2 ** 31 - 1;
});

test("stream kernels equal the synchronous ones and run in submission order", { skip }, async () => {
  const M = 64, K = 96, N = 80;
  const a = rand(M * K), b = rand(K * N), w = rand(N);
  const run = (kk: NonNullable<typeof k>["stream"] | NonNullable<typeof k>) => {
    const h = new Float32Array(M * N), n = new Float32Array(M * N), s = new Float32Array(M * N), r = new Float32Array(M);
    kk.matmul(a, b, h, M, N, K, false, 0, 1, 0, 0, 0);
    kk.rmsNorm(h, w, n, M, N, 1e-5);
    kk.siluMul(n, h, s, M * N);
    kk.softmax(s, s, M, N, false); // in place: depends on the previous job's output
    kk.reduce(0, s, r, M, N);
    return [h, n, s, r];
  };
  const want = run(k!);
  const seq0 = k!.streamCompleted();
  const got = run(k!.stream);
  assert.ok(k!.streamPending() > 0 || k!.streamCompleted() > seq0);
  await k!.streamSyncAsync();
  assert.equal(k!.streamPending(), 0);
  assert.equal(k!.streamCompleted(), seq0 + 5);
  got.forEach((g, i) => assert.deepEqual(g, want[i], `output ${i}`));
});

test("a synchronous call drains the stream first; streamSync blocks until empty", { skip }, () => {
  const n = 512;
  const a = rand(n * n), c = new Float32Array(n * n), d = new Float32Array(n * n);
  const seq = k!.stream.matmul(a, a, c, n, n, n, false, 0, 1, 0, 0, 0);
  assert.equal(typeof seq, "number");
  k!.unary(14, c, d, n * n); // square: must see the matmul's result
  const want = new Float32Array(n * n);
  k!.matmul(a, a, want, n, n, n, false, 0, 1, 0, 0, 0);
  assert.deepEqual(c, want);
  assert.deepEqual(d, want.map((x) => Math.fround(x * x)));
  k!.stream.unary(0, c, c, n * n);
  k!.streamSync();
  assert.equal(k!.streamPending(), 0);
  assert.equal(c[0], -want[0]!);
});

test("arguments and indices are validated at submit, naming the kernel", { skip }, () => {
  const table = rand(8), out = new Float32Array(4);
  assert.throws(() => k!.stream.embedding(table, 0, Int32Array.of(1, 4), out, 2, 2), /^RangeError: \[embedding\] id 4 out of range/);
  assert.throws(() => k!.stream.matmul(rand(4), rand(4), out, 2, 2, 3, false, 0, 1, 0, 0, 0), /\[matmul\] a has 4 elements, needs 6/);
  assert.throws(() => k!.stream.unary(99, out, out, 4), /\[unary\] unknown op code/);
  k!.streamSync(); // nothing was enqueued by the failed calls
  assert.equal(k!.streamPending(), 0);
});

/** Runs a script in a fresh node process; returns its exit status (null = killed by a signal). */
function runScript(source: string): { status: number | null; signal: string | null; stderr: string } {
  const dir = mkdtempSync(join(tmpdir(), "kiln-stream-"));
  const file = join(dir, "script.mjs");
  writeFileSync(file, source);
  const r = spawnSync(process.execPath, [file], { encoding: "utf8", timeout: 20_000 });
  return { status: r.status, signal: r.signal, stderr: r.stderr };
}

const kernelsInThread = `
  const k = createRequire(import.meta.url)(${JSON.stringify(addonPath)});
  const n = 384, a = new Float32Array(n * n).fill(0.5), out = new Float32Array(n * n);
  for (let i = 0; i < 3; i++) k.matmul(a, a, out, n, n, n, false, 0, 1, 0, 0, 0);
  k.softmax(a, out, n, n, false);
  for (let i = 0; i < 4; i++) k.stream.matmul(a, a, out, n, n, n, false, 0, 1, 0, 0, 0); // left pending at exit
`;

test("a worker_threads Worker using the addon (pool + stream) exits without crashing the process", { skip }, () => {
  const src = `
    import { Worker, isMainThread } from "node:worker_threads";
    import { createRequire } from "node:module";
    if (isMainThread) {
      for (let i = 0; i < 3; i++) {
        const w = new Worker(new URL(import.meta.url));
        await new Promise((resolve) => w.on("exit", resolve));
      }
    } else {
      ${kernelsInThread}
    }`;
  // the crash this guards against (the Worker dlclose()d the addon under the pool's threads) hit ~25% of runs
  for (let i = 0; i < 8; i++) {
    const r = runScript(src);
    assert.equal(r.signal, null, `run ${i} died by ${r.signal}: ${r.stderr}`);
    assert.equal(r.status, 0, `run ${i}: ${r.stderr}`);
  }
});

test("a process with work still queued on the stream exits on its own, without hanging", { skip }, () => {
  const r = runScript(`import { createRequire } from "node:module";\n${kernelsInThread}`);
  assert.equal(r.signal, null, r.stderr);
  assert.equal(r.status, 0, r.stderr);
  const awaited = runScript(`import { createRequire } from "node:module";\n${kernelsInThread}
    await k.streamSyncAsync(); if (k.streamPending() !== 0) process.exit(3);`);
  assert.equal(awaited.status, 0, awaited.stderr);
});
