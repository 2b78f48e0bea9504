// nn.Dropout: dropout while training (a reproducible mask from its generator, kept values x / (1 - p)), the identity
// (an alias of x) after eval(), no parameters, and the probabilities it refuses.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { Dropout, Linear, Module } from "../../src/nn/index.js";
import { OpError } from "../../src/util/errors.js";

class Net extends Module {
  readonly fc = this.addModule("fc", new Linear(4, 4));
  readonly drop = this.addModule("drop", new Dropout(0.5, new k.Generator(3)));
  forward(x: k.Tensor): k.Tensor {
    const h = this.fc.forward(x);
    const out = this.drop.forward(h);
    h.dispose();
    return out;
  }
}

describe("nn.Dropout", () => {
  it("drops about p of the elements in training, scaling the rest by 1 / (1 - p); the seed fixes the mask", () => {
    const x = k.randn([10000], { generator: new k.Generator(1) });
    const xv = x.toList();
    const drop = new Dropout(0.25, new k.Generator(7));
    assert.equal(drop.training, true);
    const out = drop.forward(x).toList();
    const kept = out.filter((v) => v !== 0).length / out.length;
    assert.ok(Math.abs(kept - 0.75) < 0.02, `kept ${kept}`);
    out.forEach((v, i) => v !== 0 && assert.ok(Math.abs(v - xv[i]! / 0.75) <= 1e-5 * Math.abs(v), `[${i}]`));
    assert.deepEqual(new Dropout(0.25, new k.Generator(7)).forward(x).toList(), out);
    assert.deepEqual(drop.parameters(), []);
  });

  it("is the identity after eval() (an alias of x, gradient passing), and drops again after train()", () => {
    const net = new Net();
    net.eval();
    assert.equal(net.drop.training, false);
    const x = k.randn([2, 4], { generator: new k.Generator(2) });
    const y = net.drop.forward(x);
    assert.equal(y.storage, x.storage);
    assert.deepEqual(y.toList(), x.toList());
    const out = net.forward(x);
    out.sum().backward();
    assert.ok(net.fc.weight.grad!.toList().every((g) => g !== 0), "every weight gets a gradient in eval mode");
    net.train();
    assert.equal(net.drop.training, true);
    const dropped = net.drop.forward(k.ones([1000])).toList();
    assert.ok(dropped.some((v) => v === 0) && dropped.some((v) => v === 2));
  });

  it("refuses p outside [0, 1]", () => {
    assert.throws(() => new Dropout(1.1), (e: unknown) => e instanceof OpError && e.op === "dropout");
    assert.throws(() => new Dropout(-0.5), (e: unknown) => e instanceof OpError && e.message.includes("between 0 and 1"));
  });
});
