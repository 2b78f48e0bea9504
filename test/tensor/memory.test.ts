// Buffers come back: every op frees its temporaries, dispose()/`using` free results, views keep storage alive.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { DisposedTensorError } from "../../src/util/errors.js";
import { forEachBackend } from "./suite.js";

/** One small call of every op; each returns the tensors it produced (all must be disposed by the caller). */
const scratch: Tensor[] = [];

function opCases(dev: string): [string, () => Tensor[]][] {
  const f = (shape: number[], seed = 1) => k.randn(shape, { device: dev, generator: new k.Generator(seed) });
  const i32 = (data: number[], shape?: number[]) => k.tensor(Int32Array.from(data), { device: dev, shape });
  /** Marks a temporary made inside a case (an index tensor, a view) for disposal with the case's outputs. */
  const tmp = (x: Tensor): Tensor => (scratch.push(x), x);
  /** Runs fn on fresh inputs, disposes the inputs, returns the outputs. */
  const withInputs = (inputs: Tensor[], fn: (...xs: Tensor[]) => Tensor | Tensor[] | { values: Tensor; indices: Tensor }): Tensor[] => {
    const r = fn(...inputs);
    for (const x of inputs) x.dispose();
    const outs = Array.isArray(r) ? r : r instanceof k.Tensor ? [r] : [r.values, r.indices];
    return [...outs, ...scratch.splice(0)];
  };
  return [
    ["add broadcast", () => withInputs([f([2, 3]), f([3])], (a, b) => a!.add(b!))],
    ["add alpha", () => withInputs([f([2, 3]), f([2, 1])], (a, b) => k.add(a!, b!, 2))],
    ["scalar sub", () => withInputs([f([4])], (a) => k.sub(1, a!))],
    ["int div", () => withInputs([i32([1, 2, 3])], (a) => a!.div(2))],
    ["comparison", () => withInputs([f([3]), f([3], 2)], (a, b) => a!.lt(b!))],
    ["unary chain", () => withInputs([f([5])], (a) => {
      const pos = a!.gt(0);
      return [a!.exp(), a!.gelu(), a!.gelu("tanh"), a!.silu(), a!.abs(), k.round(a!), pos, k.logicalNot(pos)];
    })],
    ["where / maskedFill / clamp", () => withInputs([f([2, 3]), f([3])], (a, b) => {
      const ma = a!.gt(0);
      const mb = b!.gt(0);
      return [ma, mb, k.where(ma, a!, b!), k.where(mb, 1, a!), a!.maskedFill(mb, 0), a!.clamp(-0.5, 0.5), a!.clamp()];
    })],
    ["casts", () => withInputs([f([4])], (a) => [a!.to("bfloat16"), a!.to("float16"), a!.to("float8_e4m3fn"), a!.to("float8_e5m2"), a!.to("int64"), a!.to("bool")])],
    ["reductions", () => withInputs([f([2, 3, 4])], (a) => [a!.sum(), a!.sum([0, 2], true), a!.mean(1), a!.max(2), a!.argmax(0), a!.argmin(), k.prod(a!, 1)])],
    ["softmax family", () => withInputs([f([3, 4])], (a) => [a!.softmax(0), a!.logSoftmax(-1), a!.logsumexp(0), a!.logsumexp(1, true), a!.cumsum(0)])],
    ["sort / topk", () => withInputs([f([3, 5])], (a) => [...Object.values(k.sort(a!, 0, true)), ...Object.values(k.topk(a!, 2))])],
    ["matmul 1-d", () => withInputs([f([3]), f([3], 2)], (a, b) => k.matmul(a!, b!))],
    ["matmul 1-d x 2-d", () => withInputs([f([3]), f([3, 2], 2)], (a, b) => [k.matmul(a!, b!), k.matmul(tmp(b!.T), a!)])],
    ["matmul broadcast", () => withInputs([f([2, 1, 2, 3]), f([3, 3, 2], 2)], (a, b) => k.matmul(a!, b!))],
    ["bmm", () => withInputs([f([2, 2, 3]), f([2, 3, 4], 2)], (a, b) => k.bmm(a!, b!))],
    ["linear bf16 + bias", () => withInputs([f([2, 3, 4]), f([5, 4], 2), f([5], 3)], (x, w, b) => {
      const wb = w!.to("bfloat16");
      const y = k.linear(x!, wb, b!);
      wb.dispose();
      return y;
    })],
    ["embedding / index_select", () => withInputs([f([4, 3]), i32([3, 0, 1, 1], [2, 2])], (w, ids) => [k.embedding(ids!, w!), k.indexSelect(w!, 1, tmp(i32([2, 0])))].flat())],
    ["embedding int64 ids", () => withInputs([f([4, 3]), k.tensor([1, 2], { device: dev, dtype: "int64" })], (w, ids) => k.embedding(ids!, w!))],
    ["gather / scatter", () => withInputs([f([3, 4]), i32([0, 2, 1, 1, 2, 0], [2, 3]), i32([0, 2, 1, 1, 2, 0, 0, 1], [2, 4]), i32([0, 2, 1, 3, 2, 0], [3, 2]), f([3, 4], 2)], (x, idx, idx0, idx1, src) => [x!.gather(0, idx!), x!.gather(1, idx!), k.scatter(x!, 0, idx0!, src!), k.scatter(x!, 1, idx1!, src!, true)])],
    ["cat / stack / split / chunk", () => withInputs([f([2, 3]), f([1, 3], 2), i32([1, 2, 3], [1, 3])], (a, b, c) => [k.cat([a!, b!, c!]), k.stack([a!, a!], 1), ...k.split(a!, 1, 1), ...k.chunk(a!, 2)])],
    ["views", () => withInputs([f([2, 3, 4])], (a) => [tmp(a!.permute(2, 0, 1)).contiguous(), tmp(a!.transpose(0, 1)).reshape(-1), tmp(a!.slice(2, 0, 4, 2)).select(0, 1), tmp(a!.narrow(1, 1, 2)).flatten(), tmp(tmp(a!.unsqueeze(0)).expand(2, 2, 3, 4)).squeeze(), a!.clone(), a!.detach()])],
    ["in place", () => withInputs([f([2, 3]), f([3], 2)], (a, b) => {
      const c = a!.clone();
      c.add_(b!).mul_(2).sub_(1).div_(b!);
      tmp(c.T).copy_(tmp(a!.T));
      tmp(c.select(0, 1)).fill_(3);
      const m = b!.gt(0);
      c.maskedFill_(m, 0);
      m.dispose();
      c.indexCopy_(0, tmp(i32([1])), tmp(a!.narrow(0, 0, 1)));
      return c;
    })],
    ["rms_norm / rotary", () => withInputs([f([3, 2, 4]), f([4], 2), f([5, 2], 3), f([5, 2], 4)], (x, w, cos, sin) => [k.rmsNorm(x!, w!, 1e-5), k.rmsNorm(tmp(x!.to("bfloat16")), w!, 1e-5), k.rotaryEmbedding(x!, tmp(i32([0, 4, 2])), cos!, sin!, true), k.rotaryEmbedding(x!, tmp(k.tensor([1, 2, 3], { device: dev, dtype: "int64" })), cos!, sin!, false)])],
    ["causal attention (GQA)", () => withInputs([f([1, 4, 3, 2]), f([1, 2, 3, 2], 2), f([1, 2, 3, 2], 3)], (q, kk, v) => k.causalAttention(q!, kk!, v!))],
    ["paged attention", () => withInputs([f([3, 2, 4]), f([3, 1, 4], 2), f([3, 1, 4], 3), k.zeros([4, 2, 1, 4], { device: dev }), k.zeros([4, 2, 1, 4], { device: dev }), i32([5, 0, 1]), i32([2, 3, 0, 1], [2, 2]), i32([0, 1, 3]), i32([2, 2])],
      (q, kn, vn, kc, vc, slots, tables, qs, lens) => k.pagedAttention({ q: q!, k: kn!, v: vn!, kCache: kc!, vCache: vc!, slotMapping: slots!, blockTables: tables!, queryStart: qs!, seqLens: lens!, scale: 0.5, slidingWindow: 1 }))],
    ["siluMul / crossEntropy", () => withInputs([f([2, 3]), f([2, 3], 2), i32([2, -100])], (g, u, tgt) => [k.siluMul(g!, u!), k.crossEntropy(g!, tgt!), k.crossEntropy(g!, tmp(k.tensor([1, 0], { device: dev, dtype: "int64" }))), k.crossEntropy(g!, tmp(i32([-100, -100])))])],
    ["random", () => [k.rand([3, 2], { device: dev }), k.randn([4], { device: dev, dtype: "bfloat16" }), ...withInputs([k.tensor([0.2, 0.8, 0], { device: dev })], (p) => k.multinomial(p!, 2))]],
    ["reads", () => withInputs([f([2, 3])], (a) => {
      tmp(a.T).dataSync();
      a.to("bfloat16").dispose();
      const b = a.to("float16");
      tmp(b.T).toList();
      b.dispose();
      return [];
    })],
  ];
}

forEachBackend((dev) => {
  const backend = k.device(dev).backend;

  describe("no leaks", () => {
    for (const [name, run] of opCases(dev)) {
      it(`${name} frees every temporary`, () => {
        const start = backend.liveBuffers();
        for (const t of run()) t.dispose();
        assert.equal(backend.liveBuffers(), start, `${name}: ${backend.liveBuffers() - start} buffers leaked`);
      });
    }

    it("thousands of ops in a loop, disposed explicitly and with `using`, return liveBuffers to its start", () => {
      const start = backend.liveBuffers();
      const startBytes = backend.liveBytes();
      const cases = opCases(dev);
      let ops = 0;
      for (let iter = 0; iter < 40; iter++) {
        for (const [, run] of cases) {
          for (const t of run()) t.dispose();
          ops++;
        }
        using a = k.randn([8, 8], { device: dev });
        using at = a.T;
        using b = a.matmul(at);
        using sm = b.softmax(-1);
        using c = sm.add(1);
        using d = c.sum(0);
        assert.equal(d.shape[0], 8);
        ops += 5;
      }
      assert.ok(ops > 1000);
      assert.equal(backend.liveBuffers(), start, "live buffers");
      assert.equal(backend.liveBytes(), startBytes, "live bytes");
    });
  });

  describe("dispose", () => {
    it("use after dispose throws DisposedTensorError naming the op", () => {
      const a = k.ones([2, 2], { device: dev });
      a.dispose();
      a.dispose(); // idempotent
      assert.equal(a.isDisposed, true);
      const named = (op: string) => (e: unknown) => e instanceof DisposedTensorError && e.op === op && e.message.startsWith(`[${op}]`);
      assert.throws(() => a.exp(), named("exp"));
      assert.throws(() => a.add(1), named("add"));
      assert.throws(() => a.sum(), named("sum"));
      assert.throws(() => k.matmul(a, a), named("matmul"));
      assert.throws(() => a.transpose(0, 1), named("transpose"));
      assert.throws(() => a.view(4), named("view"));
      assert.throws(() => a.toList(), DisposedTensorError);
      const b = k.ones([2], { device: dev });
      assert.throws(() => b.add(a), named("add"), "a disposed second operand is named too");
    });

    it("a view keeps storage alive after its base is disposed", () => {
      const start = backend.liveBuffers();
      const flat = k.arange(6, undefined, 1, { device: dev, dtype: "float32" });
      const base = flat.reshape(2, 3);
      flat.dispose();
      const v = base.T;
      const s = base.select(0, 1);
      base.dispose();
      assert.equal(backend.liveBuffers(), start + 1, "storage survives while views hold it");
      assert.deepEqual(v.toList(), [0, 3, 1, 4, 2, 5]);
      v.add_(1);
      assert.deepEqual(s.toList(), [4, 5, 6], "views still alias each other");
      v.dispose();
      assert.equal(backend.liveBuffers(), start + 1);
      s.dispose();
      assert.equal(backend.liveBuffers(), start, "freed with the last view");
    });

    it("unallocated() has a shape and dtype, holds no buffer, and throws on any read", () => {
      const start = backend.liveBuffers();
      const p = k.unallocated([4096, 4096], { device: dev, dtype: "bfloat16" });
      assert.deepEqual([p.shape, p.dtype], [[4096, 4096], "bfloat16"]);
      assert.equal(backend.liveBuffers(), start);
      assert.throws(() => p.add(1), DisposedTensorError);
      assert.throws(() => p.toList(), DisposedTensorError);
      p.dispose(); // idempotent, as for any disposed tensor
    });

    it("withMemoryPool: a freed buffer's memory goes to the next allocation of its size, results unchanged; none after", () => {
      if (!backend.withMemoryPool) return;
      const start = backend.liveBuffers();
      const x = k.arange(0, 4096, 1, { device: dev, dtype: "float32" });
      const memoryOf = (t: Tensor) => (t.storage.buffer as { raw?: ArrayBuffer }).raw ?? t.storage.buffer.host;
      const [sum, zeroSum, reused, pooled] = backend.withMemoryPool(() => {
        const a = x.mul(2);
        const first = memoryOf(a);
        a.dispose();
        const b = x.add(1); // a's size: a's memory, rewritten whole
        const reusedByB = memoryOf(b) === first;
        const total = (t: Tensor) => {
          const s = t.sum();
          const v = s.item();
          s.dispose();
          t.dispose();
          return v;
        };
        const bSum = total(b);
        const z = k.zeros([4096], { device: dev }); // b's memory again, filled with zeros
        const zReused = memoryOf(z) === first;
        return [bSum, total(z), reusedByB && zReused, first] as const;
      });
      assert.deepEqual([sum, zeroSum, reused], [(4095 * 4096) / 2 + 4096, 0, true]);
      const c = x.mul(3);
      const d = (c.dispose(), x.mul(3)); // outside the pool: never the closed pool's memory (the host cache's, maybe)
      assert.notEqual(memoryOf(c), pooled);
      assert.notEqual(memoryOf(d), pooled);
      for (const t of [x, d]) t.dispose();
      assert.equal(backend.liveBuffers(), start);
    });

    it("`using` disposes at the end of the block", () => {
      const start = backend.liveBuffers();
      let escaped: Tensor;
      {
        using t = k.zeros([3], { device: dev });
        escaped = t;
        assert.equal(backend.liveBuffers(), start + 1);
      }
      assert.equal(escaped.isDisposed, true);
      assert.equal(backend.liveBuffers(), start);
    });
  });
});
