// torch.nn's loss modules: forward(input, target) with the options given at construction, values by hand.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss, BCELoss } from "../../src/nn/index.js";
import * as k from "../../src/tensor/index.js";

const v = (xs: number[], shape?: number[]) => k.tensor(Float32Array.from(xs), shape ? { shape } : {});
const close = (t: k.Tensor, want: number | number[]) => {
  const got = t.toList();
  const w = typeof want === "number" ? [want] : want;
  got.forEach((g, i) => assert.ok(Math.abs(g - w[i]!) < 1e-5, `${g} vs ${w[i]}`));
};

describe("nn loss modules", () => {
  it("regression losses: mean, sum and none as constructed", () => {
    const x = v([1, 2, 3.5]), y = v([1, 1, 1]);
    close(new MSELoss().forward(x, y), (0 + 1 + 6.25) / 3);
    close(new MSELoss({ reduction: "sum" }).forward(x, y), 7.25);
    close(new L1Loss({ reduction: "none" }).forward(x, y), [0, 1, 2.5]);
    // smooth L1 with beta 2: |d| < 2 -> d^2 / 4, else |d| - 1
    close(new SmoothL1Loss({ beta: 2, reduction: "none" }).forward(x, y), [0, 0.25, 1.5]);
    // huber with delta 2: |d| <= 2 -> d^2 / 2, else 2 (|d| - 1)
    close(new HuberLoss({ delta: 2, reduction: "none" }).forward(x, y), [0, 0.5, 3]);
  });

  it("classification losses: cross-entropy (label smoothing, ignore index), NLL, BCE, KL", () => {
    const logits = v([0, Math.log(3), 0, 0], [2, 2]);
    const target = k.tensor(Int32Array.from([1, -100]));
    close(new CrossEntropyLoss().forward(logits, target), Math.log(4 / 3));
    // smoothing 0.1 over 2 classes: target weights 0.95 / 0.05 of -log p
    close(new CrossEntropyLoss({ labelSmoothing: 0.1 }).forward(logits, target), -(0.95 * Math.log(0.75) + 0.05 * Math.log(0.25)));
    close(new NLLLoss({ reduction: "sum" }).forward(v([-1, -2, -3, -4], [2, 2]), k.tensor(Int32Array.from([1, 0]))), 5);
    close(new BCELoss().forward(v([0.5, 0.8]), v([1, 0])), -(Math.log(0.5) + Math.log(0.2)) / 2);
    close(new BCEWithLogitsLoss({ posWeight: v([2]) }).forward(v([0]), v([1])), 2 * Math.log(2));
    // KL(target || exp(input)) summed / batch: target [0.5, 0.5], input log [0.25, 0.75]
    close(new KLDivLoss({ reduction: "batchmean" }).forward(v([Math.log(0.25), Math.log(0.75)], [1, 2]), v([0.5, 0.5], [1, 2])),
      0.5 * Math.log(0.5 / 0.25) + 0.5 * Math.log(0.5 / 0.75));
  });
});
