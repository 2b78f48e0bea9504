// crossEntropy's reduction and label_smoothing (torch's F.cross_entropy): losses and logits gradients against a
// float64 reference of the formula, with an ignored row.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";

const N = 4, V = 5, IGNORE = -100;
const logitsData = Array.from({ length: N * V }, (_, i) => Math.sin(i * 1.3) * 2 + (i % V) * 0.1);
const targetsData = [2, IGNORE, 0, 4];

/** Per-row losses and d(sum_i w_i * loss_i)/dlogits in float64. */
function reference(eps: number, w: number[]) {
  const losses: number[] = [], grad: number[] = [];
  for (let i = 0; i < N; i++) {
    const row = logitsData.slice(i * V, i * V + V);
    const m = Math.max(...row);
    const lse = m + Math.log(row.reduce((a, v) => a + Math.exp(v - m), 0));
    const logp = row.map((v) => v - lse);
    const t = targetsData[i]!;
    if (t === IGNORE) {
      losses.push(0);
      grad.push(...new Array<number>(V).fill(0));
      continue;
    }
    losses.push(-(1 - eps) * logp[t]! - (eps / V) * logp.reduce((a, v) => a + v, 0));
    logp.forEach((lp, j) => grad.push(w[i]! * (Math.exp(lp) - ((j === t ? 1 - eps : 0) + eps / V))));
  }
  return { losses, grad };
}

const close = (got: ArrayLike<number>, want: ArrayLike<number>, tol = 1e-5) => {
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) <= tol, `[${i}] ${got[i]} vs ${want[i]}`);
};

describe("crossEntropy options", () => {
  const targets = k.tensor(targetsData, { dtype: "int32" });
  for (const eps of [0, 0.1]) {
    it(`reduction none / sum / mean with label_smoothing ${eps}: values and gradients`, () => {
      const count = 3;
      const upstream = [0.5, 2, -1, 1.5];
      for (const [reduction, weights] of [
        ["none", upstream], ["sum", [1, 1, 1, 1]], ["mean", [1 / count, 1 / count, 1 / count, 1 / count]],
      ] as const) {
        const logits = k.tensor(logitsData, { shape: [N, V], requiresGrad: true });
        const loss = k.crossEntropy(logits, targets, { ignoreIndex: IGNORE, reduction, labelSmoothing: eps });
        const ref = reference(eps, [...weights]);
        const total = ref.losses.reduce((a, b) => a + b, 0);
        if (reduction === "none") {
          assert.deepEqual([...loss.shape], [N]);
          close(loss.dataSync() as Float32Array, ref.losses);
          loss.mul(k.tensor(upstream)).sum().backward();
        } else {
          assert.deepEqual([...loss.shape], []);
          close([loss.item()], [reduction === "sum" ? total : total / count]);
          loss.backward();
        }
        close(logits.grad!.dataSync() as Float32Array, ref.grad);
      }
    });
  }

  it("a number third argument is still ignoreIndex; bad options are typed errors", () => {
    const logits = k.tensor(logitsData, { shape: [N, V] });
    close([k.crossEntropy(logits, targets, IGNORE).item()], [reference(0, [1, 1, 1, 1]).losses.reduce((a, b) => a + b, 0) / 3]);
    assert.throws(() => k.crossEntropy(logits, targets, { labelSmoothing: 1.5 }), OpError);
    assert.throws(() => k.crossEntropy(logits, targets, { reduction: "avg" as never }), OpError);
    const none = k.crossEntropy(logits, k.tensor([IGNORE, IGNORE, IGNORE, IGNORE], { dtype: "int32" }), { reduction: "none" });
    assert.deepEqual([...(none.dataSync() as Float32Array)], [0, 0, 0, 0]);
  });
});
