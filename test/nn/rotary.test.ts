// Rotary scaling variants against values computed by hand from Hugging Face's definitions
// (transformers modeling_rope_utils: _compute_{linear,dynamic,llama3,yarn}_parameters).
import { test } from "node:test";
import assert from "node:assert/strict";
import { rotaryInvFreq, RotaryEmbedding } from "../../src/nn/rotary.js";
import { tensor } from "../../src/tensor/index.js";

const close = (a: ArrayLike<number>, b: number[], tol = 1e-9) => {
  assert.equal(a.length, b.length);
  for (let i = 0; i < b.length; i++) assert.ok(Math.abs(a[i]! - b[i]!) <= tol * Math.max(1, Math.abs(b[i]!)), `index ${i}: ${a[i]} vs ${b[i]}`);
};

test("default: inv_freq = theta^(-2i/dim)", () => {
  const r = rotaryInvFreq({ rotaryDim: 8, theta: 10000, maxPositions: 16, scaling: null });
  close(r.invFreq, [1, 0.1, 0.01, 0.001]);
  assert.equal(r.attentionFactor, 1);
});

test("linear: frequencies divided by the factor", () => {
  const r = rotaryInvFreq({ rotaryDim: 8, theta: 10000, maxPositions: 16, scaling: { type: "linear", factor: 4 } });
  close(r.invFreq, [0.25, 0.025, 0.0025, 0.00025]);
});

test("dynamic NTK: base stretched for max_position * factor", () => {
  // base' = 10000 * (2*2 - 1)^(8/6) = 10000 * 3^(4/3)
  const base = 10000 * Math.pow(3, 4 / 3);
  const r = rotaryInvFreq({ rotaryDim: 8, theta: 10000, maxPositions: 16, scaling: { type: "dynamic", factor: 2, originalMaxPositionEmbeddings: 16 } });
  close(r.invFreq, [1, Math.pow(base, -0.25), Math.pow(base, -0.5), Math.pow(base, -0.75)]);
  assert.equal(r.tablePositions, 32);
});

test("llama3: high frequencies kept, low divided by factor, the middle band smoothed", () => {
  // wavelengths 2pi/f = 6.28, 62.8, 628, 6283; high_wavelen = 8192/4 = 2048, low_wavelen = 8192/1
  // f3: smooth = (8192/6283.185 - 1) / 3; f = (1 - smooth) * 0.001/8 + smooth * 0.001
  const smooth = (8192 / ((2 * Math.PI) / 0.001) - 1) / 3;
  const r = rotaryInvFreq({
    rotaryDim: 8,
    theta: 10000,
    maxPositions: 16,
    scaling: { type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 },
  });
  close(r.invFreq, [1, 0.1, 0.01, (1 - smooth) * 0.000125 + smooth * 0.001]);
  assert.ok(Math.abs(r.invFreq[3]! - 0.00021361) < 1e-8, String(r.invFreq[3]));
});

test("yarn: ramp between correction dims, attention factor 0.1 ln(s) + 1", () => {
  // low = floor(8 ln(2048/(32*2pi)) / (2 ln 1e4)) = 1, high = ceil(8 ln(2048/(2pi)) / (2 ln 1e4)) = 3
  // ramp = [0, 0, 0.5, 1] -> extrapolation share [1, 1, 0.5, 0]
  const r = rotaryInvFreq({
    rotaryDim: 8,
    theta: 10000,
    maxPositions: 8192,
    scaling: { type: "yarn", factor: 4, originalMaxPositionEmbeddings: 2048, betaFast: 32, betaSlow: 1, attentionFactor: null, mscale: null, mscaleAllDim: null },
  });
  close(r.invFreq, [1, 0.1, 0.5 * 0.0025 + 0.5 * 0.01, 0.00025]);
  assert.ok(Math.abs(r.attentionFactor - (0.1 * Math.log(4) + 1)) < 1e-12);
});

test("tables: cos/sin at a position, scaled by the attention factor", () => {
  const rot = new RotaryEmbedding({ rotaryDim: 4, theta: 100, maxPositions: 8, scaling: null });
  const cos = rot.cos.dataSync() as Float32Array;
  const sin = rot.sin.dataSync() as Float32Array;
  // position 3, freqs [1, 0.1]
  close([cos[6]!, cos[7]!, sin[6]!, sin[7]!], [Math.cos(3), Math.cos(0.3), Math.sin(3), Math.sin(0.3)], 1e-6);
  // rotating [1, 0, 0, 0] (neox pairs (0,2), (1,3)) at position 3 gives [cos 3, 0, sin 3, 0]
  const x = tensor([1, 0, 0, 0], { shape: [1, 1, 4] });
  const y = rot.apply(x, tensor(Int32Array.from([3]))).dataSync() as Float32Array;
  close(Array.from(y), [Math.cos(3), 0, Math.sin(3), 0], 1e-6);
});
