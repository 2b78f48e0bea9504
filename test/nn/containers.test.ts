// torch.nn's containers and activation modules: parameter names as torch gives them, Sequential's forward equal to the
// modules called by hand, an MLP built from them learning XOR, and apply / zeroGrad / requiresGrad_ / modules().
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  ContainerError, GELU, Identity, Linear, LogSoftmax, Module, ModuleDict, ModuleList, ReLU, Sequential, SiLU, Softmax, Tanh, Flatten, Sigmoid,
} from "../../src/nn/index.js";
import * as k from "../../src/tensor/index.js";
import { AdamW } from "../../src/train/optim.js";

describe("nn containers", () => {
  it("Sequential names parameters by position or key, and its forward is the modules in order", () => {
    k.manualSeed(1);
    const a = new Linear(3, 4, true), b = new Linear(4, 2, true);
    const seq = new Sequential(a, new ReLU(), b);
    assert.deepEqual([...seq.stateDict().keys()], ["0.weight", "0.bias", "2.weight", "2.bias"]);
    assert.equal(seq.length, 3);
    assert.equal(seq.at(-1), b);
    const x = k.randn([5, 3]);
    const want = b.forward(a.forward(x).relu()).toList();
    assert.deepEqual(seq.forward(x).toList(), want);
    const named = new Sequential({ fc1: new Linear(3, 4, true), act: new GELU("tanh"), fc2: new Linear(4, 2, false) });
    assert.deepEqual([...named.stateDict().keys()], ["fc1.weight", "fc1.bias", "fc2.weight"]);
    assert.deepEqual([...new Linear(2, 3).stateDict().keys()], ["weight", "bias"], "a bias by default, as torch's nn.Linear");
    assert.throws(() => seq.at(3), (e) => e instanceof ContainerError && /index 3 is out of range for 3 modules/.test(e.message));
    assert.throws(() => new Sequential(3 as unknown as Linear), /entry 0 is not a module with forward\(x\)/);
  });

  it("ModuleList and ModuleDict give torch's names (layers.0.weight, heads.cls.weight)", () => {
    class Net extends Module {
      readonly layers = this.addModule("layers", new ModuleList([new Linear(2, 2, false), new Linear(2, 2, false)]));
      readonly heads = this.addModule("heads", new ModuleDict({ cls: new Linear(2, 3, false), reg: new Linear(2, 1, true) }));
    }
    const net = new Net();
    assert.deepEqual([...net.stateDict().keys()], ["layers.0.weight", "layers.1.weight", "heads.cls.weight", "heads.reg.weight", "heads.reg.bias"]);
    net.layers.append(new Linear(2, 2));
    assert.equal(net.getParameter("layers.2.weight")!.shape[0], 2);
    assert.deepEqual([...net.heads.keys()], ["cls", "reg"]);
    assert.throws(() => net.heads.get("nope"), /no module "nope" \(keys: cls, reg\)/);
    assert.throws(() => net.heads.set("a.b", new Linear(1, 1)), /must be non-empty and hold no "\."/);
    assert.equal(net.modules().length, 1 + 1 + 3 + 1 + 2);
    assert.deepEqual(net.namedChildren().map(([n]) => n), ["layers", "heads"]);
  });

  it("activation modules compute their functions (values by hand)", () => {
    const x = k.tensor(Float32Array.from([-2, 0, 1.5]));
    const close = (t: k.Tensor, want: number[]) => t.toList().forEach((v, i) => assert.ok(Math.abs(v - want[i]!) < 1e-6, `${v} vs ${want[i]}`));
    close(new ReLU().forward(x), [0, 0, 1.5]);
    close(new Tanh().forward(x), [-2, 0, 1.5].map(Math.tanh));
    close(new Sigmoid().forward(x), [-2, 0, 1.5].map((v) => 1 / (1 + Math.exp(-v))));
    close(new SiLU().forward(x), [-2, 0, 1.5].map((v) => v / (1 + Math.exp(-v))));
    const e = [-2, 0, 1.5].map(Math.exp), z = e.reduce((a, b) => a + b, 0);
    close(new Softmax().forward(x), e.map((v) => v / z));
    close(new LogSoftmax(0).forward(x), e.map((v) => Math.log(v / z)));
    assert.equal(new Identity().forward(x), x);
    assert.deepEqual(new Flatten().forward(k.zeros([2, 3, 4])).shape, [2, 12]);
  });

  it("an MLP from Sequential learns XOR (AdamW, 300 steps)", () => {
    k.manualSeed(3);
    const mlp = new Sequential(new Linear(2, 8, true), new Tanh(), new Linear(8, 1, true));
    const x = k.tensor(Float32Array.from([0, 0, 0, 1, 1, 0, 1, 1]), { shape: [4, 2] });
    const y = k.tensor(Float32Array.from([0, 1, 1, 0]), { shape: [4, 1] });
    const opt = new AdamW(mlp.parameters(), { lr: 0.05, weightDecay: 0 });
    let loss = Infinity;
    for (let step = 0; step < 300; step++) {
      const out = mlp.forward(x);
      const l = out.sub(y).square().mean();
      loss = l.item();
      l.backward();
      opt.step();
      mlp.zeroGrad();
    }
    assert.ok(loss < 0.01, `final mse ${loss}`);
    const pred = mlp.forward(x).toList();
    assert.deepEqual(pred.map((v) => Math.abs(Math.round(v))), [0, 1, 1, 0]);
  });

  it("apply visits children before parents; zeroGrad drops grads; requiresGrad_(false) freezes", () => {
    const seq = new Sequential(new Linear(2, 2, true), new ReLU(), new Sequential(new Linear(2, 1)));
    const order: string[] = [];
    seq.apply((m) => order.push(m.constructor.name));
    assert.deepEqual(order, ["Linear", "ReLU", "Linear", "Sequential", "Sequential"]);
    seq.forward(k.ones([3, 2])).sum().backward();
    assert.ok(seq.parameters().every((p) => p.grad !== null));
    seq.zeroGrad();
    assert.ok(seq.parameters().every((p) => p.grad === null));
    seq.requiresGrad_(false);
    assert.ok(seq.parameters().every((p) => !p.requiresGrad));
    assert.equal(seq.forward(k.ones([3, 2])).requiresGrad, false);
  });
});

describe("checkpointSequential", () => {
  it("gives a Sequential's gradients with fewer bytes alive after the forward", async () => {
    const { checkpointSequential } = await import("../../src/nn/index.js");
    k.manualSeed(9);
    const layers = Array.from({ length: 16 }, (_, i) => (i % 2 === 0 ? new Linear(16, 16, true) : new Tanh()));
    const seq = new Sequential(...layers);
    const x = k.randn([64, 16], { requiresGrad: true });
    const run = (checkpointed: boolean) => {
      const base = k.memoryAllocated();
      const out = checkpointed ? checkpointSequential(seq, 4, x) : seq.forward(x);
      const alive = k.memoryAllocated() - base;
      out.square().sum().backward();
      const grads = [x.grad!.toList(), ...seq.parameters().map((p) => p.grad!.toList())];
      seq.zeroGrad();
      x.grad = null;
      return { alive, grads };
    };
    const plain = run(false);
    const ckpt = run(true);
    ckpt.grads.forEach((g, i) => g.forEach((v, j) => assert.ok(Math.abs(v - plain.grads[i]![j]!) <= 1e-5 + 1e-5 * Math.abs(v), `grad ${i}[${j}]`)));
    // [64, 16] float32 activations: plain keeps each Tanh's output (8); in 4 segments of 4 modules the first three keep
    // only their outputs (each the next one's saved input) and the last, run plainly, its two Tanh outputs
    const act = 64 * 16 * 4;
    assert.equal(plain.alive, 8 * act);
    assert.equal(ckpt.alive, 5 * act);
    assert.throws(() => checkpointSequential(seq, 17, x), /segments must be an integer in \[1, 16\], got 17/);
  });
});
