// Op-level selective activation checkpointing (torch's create_selective_checkpoint_contexts, TorchTitan's op SAC):
// gradients equal a direct call's, the ops the policy saves do not run again in backward while every other op does
// (counted in kernel launches), the saved outputs are exactly what stays alive after the forward besides the region's
// output (counted in bytes), and a policy answering anything but "save" / "recompute" fails with a typed error.
import { it } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { countKernels as countDeviceKernels } from "../helpers/kernel-counts.js";
import { assertClose, forEachBackend, prng } from "./suite.js";

type Mode = "plain" | "full" | "op";

forEachBackend((dev) => {
  const ft = (data: number[], shape: number[], requiresGrad = false) =>
    k.tensor(Float32Array.from(data), { device: dev, shape, requiresGrad });
  const randomData = (n: number, seed: number, scale = 1) => {
    const r = prng(seed);
    return Array.from({ length: n }, () => (2 * r() - 1) * scale);
  };

  /** Runs fn counting the kernels launched on this device by kind ("matmul", "unary:tanh", ...). */
  const countKernels = (fn: () => void): Map<string, number> => countDeviceKernels(dev, fn);

  /** a + tanh(tanh(tanh(a @ W0) @ W1) @ W2): three matrix products (mm calls 0, 1, 2) between elementwise ops. */
  const region = (a: Tensor, Ws: Tensor[]): Tensor => {
    let h = a;
    for (const W of Ws) {
      const m = h.matmul(W);
      const t = m.tanh();
      m.dispose();
      if (h !== a) h.dispose();
      h = t;
    }
    const out = a.add(h);
    h.dispose();
    return out;
  };

  const runRegion = (mode: Mode, rows: number, width: number) => {
    const x = ft(randomData(rows * width, 1), [rows, width], true);
    const Ws = [0, 1, 2].map((i) => ft(randomData(width * width, 10 + i, 1 / Math.sqrt(width)), [width, width], true));
    const base = k.memoryAllocated(dev);
    let y!: Tensor;
    const forward = countKernels(() => {
      if (mode === "plain") y = region(x, Ws);
      else y = k.checkpoint((a) => region(a, Ws), [x], { parameters: Ws, ...(mode === "op" ? { policy: k.opSacPolicy } : {}) });
    });
    const afterForward = k.memoryAllocated(dev) - base;
    const loss = y.square().sum();
    y.dispose();
    const backward = countKernels(() => loss.backward());
    loss.dispose();
    const grads = [x, ...Ws].map((t) => t.grad!.toList());
    for (const t of [x, ...Ws]) t.dispose();
    return { forward, backward, afterForward, grads };
  };

  it("TorchTitan's policy: gradients equal the plain call's; mm calls 0 and 2 are not recomputed, mm 1 and every tanh are; their outputs are what stays alive", () => {
    const [rows, width] = [64, 16];
    const plain = runRegion("plain", rows, width);
    const full = runRegion("full", rows, width);
    const op = runRegion("op", rows, width);
    for (const r of [full, op]) r.grads.forEach((g, i) => assertClose(g, plain.grads[i]!, { rtol: 1e-6, atol: 1e-6, msg: `grad ${i}` }));
    // the forward runs 3 products and 3 tanh whatever the mode
    for (const r of [plain, full, op]) assert.deepEqual([r.forward.get("matmul"), r.forward.get("unary:tanh")], [3, 3]);
    // backward: each product's two gradient products (g @ W^T, h^T @ g); full recomputes all 3 products, op only mm 1
    assert.equal(plain.backward.get("matmul"), 6);
    assert.equal(full.backward.get("matmul"), 6 + 3);
    assert.equal(op.backward.get("matmul"), 6 + 1);
    // every tanh is recomputed under both policies (tanh's backward itself launches no tanh)
    assert.equal(plain.backward.get("unary:tanh") ?? 0, 0);
    assert.equal(full.backward.get("unary:tanh"), 3);
    assert.equal(op.backward.get("unary:tanh"), 3);
    const act = rows * width * 4;
    // plain: the 3 tanh outputs (their backward's and the next product's saved values) and the output
    assert.equal(plain.afterForward, 4 * act);
    // full: the output only; op: the output and the saved outputs of mm 0 and mm 2
    assert.equal(full.afterForward, act);
    assert.equal(op.afterForward, 3 * act);
  });

  it("the policy is asked once per op call in the forward (0-based per op), and not again in the recomputation", () => {
    const x = ft(randomData(32, 2), [4, 8], true);
    const Ws = [0, 1, 2].map((i) => ft(randomData(64, 20 + i, 0.3), [8, 8], true));
    const asked: string[] = [];
    const y = k.checkpoint((a) => region(a, Ws), [x], {
      parameters: Ws,
      policy: (op, i) => {
        asked.push(`${op}${i}`);
        return i === 1 ? "save" : "recompute";
      },
    });
    assert.deepEqual(asked, ["mm0", "mm1", "mm2"]);
    const backward = countKernels(() => y.sum().backward());
    assert.deepEqual(asked, ["mm0", "mm1", "mm2"]);
    assert.equal(backward.get("matmul"), 6 + 2); // mm 0 and mm 2 recomputed
    const gx = x.grad!.toList();
    x.grad = null;
    for (const W of Ws) W.grad = null;
    region(x, Ws).sum().backward();
    assertClose(gx, x.grad!.toList(), { rtol: 1e-6, atol: 1e-6 });
  });

  it("a block of linears and causal attention: same gradients, and op SAC skips the saved linears and the attention", () => {
    const [S, D, H] = [8, 16, 2];
    const block = (x: Tensor, Ws: Tensor[]): Tensor => {
      const heads = (t: Tensor) => t.view(1, S, H, D / H).transpose(1, 2); // [1, H, S, D/H]
      const [q, kk, v] = Ws.slice(0, 3).map((W) => heads(k.linear(x, W)));
      const o = k.causalAttention(q!, kk!, v!); // [1, H, S, D/H]
      const merged = o.transpose(1, 2).reshape(1, S, D);
      return k.linear(merged, Ws[3]!).tanh();
    };
    const run = (mode: Mode) => {
      const x = ft(randomData(S * D, 3), [1, S, D], true);
      const Ws = [0, 1, 2, 3].map((i) => ft(randomData(D * D, 30 + i, 1 / Math.sqrt(D)), [D, D], true));
      const y = mode === "plain" ? block(x, Ws) : k.checkpoint((a) => block(a, Ws), [x], { parameters: Ws, ...(mode === "op" ? { policy: k.opSacPolicy } : {}) });
      const backward = countKernels(() => y.square().sum().backward());
      return { matmuls: backward.get("matmul") ?? 0, attention: backward.get("flash_attention") ?? 0, grads: [x, ...Ws].map((t) => t.grad!.toList()) };
    };
    const plain = run("plain");
    const full = run("full");
    const op = run("op");
    for (const r of [full, op]) r.grads.forEach((g, i) => assertClose(g, plain.grads[i]!, { rtol: 1e-5, atol: 1e-6, msg: `grad ${i}` }));
    // the forward's products: 4 linears and the attention (training attention is the flash kernel); full recomputes all
    assert.equal(full.matmuls - plain.matmuls, 4);
    assert.equal(full.attention - plain.attention, 1);
    // op: linears 1 (k) and 3 (o); the attention's output and log-sum-exp come back from the forward
    assert.equal(op.matmuls - plain.matmuls, 2);
    assert.equal(op.attention - plain.attention, 0);
  });

  it("buffers come back after backward, and a second backward with retainGraph reuses the saved outputs", () => {
    const backend = k.device(dev).backend;
    const before = backend.liveBuffers();
    const x = ft(randomData(32, 4), [4, 8], true);
    const Ws = [0, 1, 2].map((i) => ft(randomData(64, 40 + i, 0.3), [8, 8], true));
    const y = k.checkpoint((a) => region(a, Ws), [x], { parameters: Ws, policy: k.opSacPolicy });
    const loss = y.sum();
    y.dispose();
    loss.backward(undefined, { retainGraph: true });
    const once = x.grad!.toList();
    const second = countKernels(() => loss.backward());
    assert.equal(second.get("matmul"), 6 + 1);
    assertClose(x.grad!.toList(), once.map((v) => 2 * v), { rtol: 1e-6, atol: 1e-6 });
    loss.dispose();
    for (const t of [x, ...Ws]) {
      t.grad?.dispose();
      t.dispose();
    }
    assert.equal(backend.liveBuffers(), before);
  });

  it("a checkpoint inside a policy region is part of it: the same gradients", () => {
    const x = ft(randomData(32, 5), [4, 8], true);
    const Ws = [0, 1, 2].map((i) => ft(randomData(64, 50 + i, 0.3), [8, 8], true));
    const y = k.checkpoint((a) => k.checkpoint((b) => region(b, Ws), [a.mul(2)], { parameters: Ws }), [x], { parameters: Ws, policy: k.opSacPolicy });
    y.square().sum().backward();
    const gx = x.grad!.toList();
    x.grad = null;
    region(x.mul(2), Ws).square().sum().backward();
    assertClose(gx, x.grad!.toList(), { rtol: 1e-6, atol: 1e-6 });
  });

  it("a policy answering anything but save / recompute is a CheckpointPolicyError naming the answer and the op call; nothing leaks", () => {
    const backend = k.device(dev).backend;
    const x = ft(randomData(32, 6), [4, 8], true);
    const Ws = [0, 1, 2].map((i) => ft(randomData(64, 60 + i, 0.3), [8, 8], true));
    const before = backend.liveBuffers();
    const bad = (op: k.SacOp, i: number) => (i === 1 ? "keep" : "save") as k.SacDecision;
    assert.throws(() => k.checkpoint((a) => region(a, Ws), [x], { parameters: Ws, policy: bad }), (e: unknown) => {
      assert.ok(e instanceof k.CheckpointPolicyError);
      assert.equal(e.returned, "keep");
      assert.match(e.message, /^\[checkpoint\] the selective checkpoint policy returned "keep" for mm call 1; expected "save" or "recompute"$/);
      return true;
    });
    // tanh(mm 0) stays: the region's own temporary, which it drops when the policy throws; the output kept for mm 0 is freed
    assert.equal(backend.liveBuffers(), before + 1);
    assert.throws(() => k.checkpoint((a) => region(a, Ws), [x], { parameters: Ws, policy: "op" as unknown as k.SacPolicy }), /\[checkpoint\] policy must be a function/);
    // a saved output written in place in the forward would be handed back modified: refused, naming the op call
    const y = k.checkpoint((a) => a.matmul(Ws[0]!).mul_(2).tanh(), [x], { parameters: Ws, policy: k.opSacPolicy });
    assert.throws(() => y.sum().backward(), /\[checkpoint\] the saved output of mm call 0 was modified by an in-place operation/);
    // a region that runs other ops in its recomputation than in its forward is refused at the first saved call it misses
    let calls = 0;
    const z = k.checkpoint((a) => (calls++ === 0 ? a : a.narrow(0, 0, 2)).matmul(Ws[0]!).tanh(), [x], { parameters: Ws, policy: k.opSacPolicy });
    assert.throws(() => z.sum().backward(), /\[checkpoint\] the recomputation's mm call 0 reads float32\[2, 8\], float32\[8, 8\] where the forward's read float32\[4, 8\], float32\[8, 8\]/);
  });
});
