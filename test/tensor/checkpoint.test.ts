// Activation checkpointing (torch.utils.checkpoint): gradients equal a direct call's (and a hand-derived formula's),
// the region keeps only its output alive after the forward (counted in bytes), the default generator's draws are
// replayed in the recomputation, and misuse fails with the op named.
import { it } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { assertClose, forEachBackend, prng } from "./suite.js";

forEachBackend((dev) => {
  const ft = (data: number[], shape: number[], requiresGrad = false) =>
    k.tensor(Float32Array.from(data), { device: dev, shape, requiresGrad });
  const randomData = (n: number, seed: number) => {
    const r = prng(seed);
    return Array.from({ length: n }, () => 2 * r() - 1);
  };

  it("gradients of tanh(x * w) through a checkpoint equal the hand-derived ones (1 - y^2) * w and (1 - y^2) * x", () => {
    const xs = [0.5, -1, 0.25];
    const ws = [2, 0.25, -3];
    const x = ft(xs, [3], true);
    const w = ft(ws, [3], true);
    const y = k.checkpoint((a) => a.mul(w).tanh(), [x], { parameters: [w] });
    assert.ok(y.requiresGrad && y.gradFn?.op === "checkpoint");
    y.sum().backward();
    const ys = xs.map((v, i) => Math.tanh(v * ws[i]!));
    assertClose(x.grad!, ys.map((v, i) => (1 - v * v) * ws[i]!), { rtol: 1e-5, atol: 1e-6 });
    assertClose(w.grad!, ys.map((v, i) => (1 - v * v) * xs[i]!), { rtol: 1e-5, atol: 1e-6 });
  });

  /** h + tanh(h @ W): one residual layer, its temporaries disposed as model code does. */
  const layer = (h: Tensor, W: Tensor): Tensor => {
    const m = h.matmul(W);
    const t = m.tanh();
    const out = h.add(t);
    m.dispose();
    t.dispose();
    return out;
  };

  /** A stack of residual layers, each optionally checkpointed; the input's and weights' grads after backward. */
  const runStack = (checkpointed: boolean, rows: number, width: number, layers: number) => {
    const x = ft(randomData(rows * width, 1), [rows, width], true);
    const Ws = Array.from({ length: layers }, (_, i) => ft(randomData(width * width, 10 + i).map((v) => v / width), [width, width], true));
    const base = k.memoryAllocated(dev);
    k.resetPeakMemoryStats(dev);
    let h = x;
    for (const W of Ws) {
      const next = checkpointed ? k.checkpoint((a) => layer(a, W), [h], { parameters: [W] }) : layer(h, W);
      if (h !== x) h.dispose();
      h = next;
    }
    const afterForward = k.memoryAllocated(dev) - base;
    const loss = h.square().sum();
    h.dispose();
    loss.backward();
    const peak = k.maxMemoryAllocated(dev) - base;
    loss.dispose();
    const grads = { x: x.grad!.toList(), W: Ws.map((W) => W.grad!.toList()) };
    for (const t of [x, ...Ws]) t.dispose();
    return { afterForward, peak, grads };
  };

  it("a checkpointed stack gives the gradients of the plain stack and keeps only each layer's output alive", () => {
    const [rows, width, layers] = [256, 16, 6];
    const plain = runStack(false, rows, width, layers);
    const ckpt = runStack(true, rows, width, layers);
    assertClose(ckpt.grads.x, plain.grads.x, { rtol: 1e-5, atol: 1e-6, msg: "x.grad" });
    ckpt.grads.W.forEach((g, i) => assertClose(g, plain.grads.W[i]!, { rtol: 1e-5, atol: 1e-6, msg: `W${i}.grad` }));
    const act = rows * width * 4;
    // plain: each layer keeps tanh's output (its backward's) and its own output (the next matmul's saved input)
    assert.equal(plain.afterForward, 2 * layers * act);
    // checkpointed: only the layers' outputs (each the next region's saved input; the last the loss's)
    assert.equal(ckpt.afterForward, layers * act);
    assert.ok(ckpt.peak < plain.peak, `peak ${ckpt.peak} bytes checkpointed vs ${plain.peak} plain`);
  });

  it("buffers come back after backward (the recomputation's graph and the saved inputs are freed)", () => {
    const backend = k.device(dev).backend;
    const before = backend.liveBuffers();
    const x = ft(randomData(32, 3), [4, 8], true);
    const W = ft(randomData(64, 4), [8, 8], true);
    const y = k.checkpoint((a) => layer(a, W), [x], { parameters: [W] });
    const loss = y.sum();
    y.dispose();
    loss.backward();
    loss.dispose();
    for (const t of [x.grad!, W.grad!, x, W]) t.dispose();
    assert.equal(backend.liveBuffers(), before);
  });

  it("nested checkpoints and a second backward accumulate the same gradients as direct calls", () => {
    const xs = randomData(12, 5);
    const ws = randomData(16, 6);
    const grads = (nested: boolean) => {
      const x = ft(xs, [3, 4], true);
      const W = ft(ws, [4, 4], true);
      for (let pass = 0; pass < 2; pass++) {
        const f = (a: Tensor) => layer(layer(a, W), W);
        const y = nested ? k.checkpoint((a) => k.checkpoint((b) => layer(b, W), [layer(a, W)], { parameters: [W] }), [x], { parameters: [W] }) : f(x);
        y.square().sum().backward();
      }
      return [x.grad!.toList(), W.grad!.toList()];
    };
    const [gx, gW] = grads(false);
    const [cx, cW] = grads(true);
    assertClose(cx!, gx!, { rtol: 1e-5, atol: 1e-6 });
    assertClose(cW!, gW!, { rtol: 1e-5, atol: 1e-6 });
  });

  it("the recomputation replays the default generator's draws (a random mask is the forward's)", () => {
    const xs = randomData(64, 7);
    const masked = (a: Tensor) => {
      const r = k.rand([64], { device: dev });
      const keep = r.lt(0.5);
      const out = k.where(keep, a.mul(2), 0);
      r.dispose();
      keep.dispose();
      return out;
    };
    const run = (checkpointed: boolean) => {
      k.manualSeed(42);
      const x = ft(xs, [64], true);
      const y = checkpointed ? k.checkpoint(masked, [x]) : masked(x);
      const after = k.defaultGenerator.getState().counter;
      y.mul(y).sum().backward();
      assert.equal(k.defaultGenerator.getState().counter, after, "backward leaves the generator where the forward left it");
      return { y: y.toList(), g: x.grad!.toList() };
    };
    const plain = run(false);
    const ckpt = run(true);
    assert.deepEqual(ckpt.y, plain.y);
    assertClose(ckpt.g, plain.g, { rtol: 0, atol: 0 });
    // the gradient is 8x where kept (d/dx (2x)^2) and 0 elsewhere: about half of each
    const kept = plain.g.filter((v) => v !== 0).length;
    assert.ok(kept > 16 && kept < 48, `${kept} of 64 kept`);
  });

  it("without grad mode, or with nothing requiring grad, it is a plain call", () => {
    const x = ft([1, 2], [2]);
    const y = k.checkpoint((a) => a.mul(3), [x]);
    assert.equal(y.gradFn, null);
    assert.equal(y.requiresGrad, false);
    const xg = ft([1, 2], [2], true);
    const z = k.noGrad(() => k.checkpoint((a) => a.mul(3), [xg]));
    assert.equal(z.gradFn, null);
    assert.deepEqual(z.toList(), [3, 6]);
  });

  it("an input changed in place after the forward, a region returning its input, and a non-tensor result are refused", () => {
    const x = ft([1, 2], [2], true);
    const saved = x.detach();
    const y = k.checkpoint((a) => a.mul(3), [x]);
    saved.add_(1);
    assert.throws(() => y.sum().backward(), /\[checkpoint\].*modified by an in-place operation/);
    assert.throws(() => k.checkpoint((a) => a, [x]), /\[checkpoint\].*returned one of its inputs/);
    assert.throws(() => k.checkpoint(() => 3 as unknown as Tensor, [x]), /\[checkpoint\].*must return a Tensor/);
  });
});
