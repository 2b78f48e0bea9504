// float8 e4m3fn encoding (quant-reference floatToFp8, mirrored by native/quant-impl.inc, whose weights
// test/backends/quant-kernels.test.ts checks code for code against it): the nearest code, a tie to the even code,
// checked against a brute-force scan of all 127 magnitudes at every code's value, every midpoint between two
// neighbours and points just either side of them, and a dense sweep of [0, 460].
import assert from "node:assert/strict";
import { test } from "node:test";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { FP8_E4M3, floatToFp8 } from "../../src/backends/cpu/quant-reference.js";

/** Nearest of codes 0..126 by exhaustive scan, ties to the even code; sign bit from x. */
function bruteForce(x: number): number {
  const a = Math.abs(x);
  if (!(a > 0)) return x < 0 ? 0x80 : 0;
  let best = 0;
  for (let c = 1; c <= 126; c++) {
    const e = Math.abs(FP8_E4M3[c]! - a), eb = Math.abs(FP8_E4M3[best]! - a);
    if (e < eb || (e === eb && (c & 1) === 0)) best = c;
  }
  return (x < 0 ? 0x80 : 0) | best;
}

/** Every code's value, the midpoints between neighbours and points 2^-20 either side, and the ends, with both signs. */
function edgePoints(): number[] {
  const points: number[] = [0, 1e-30, 448, 449, 1e6, Infinity];
  for (let c = 0; c <= 126; c++) {
    const v = FP8_E4M3[c]!;
    points.push(v);
    if (c < 126) {
      const mid = Math.fround((v + FP8_E4M3[c + 1]!) / 2);
      points.push(mid, Math.fround(mid * (1 + 2 ** -20)), Math.fround(mid * (1 - 2 ** -20)));
    }
  }
  return points.flatMap((p) => [p, -p]);
}

test("floatToFp8 is the nearest e4m3fn code with ties to even: codes, midpoints, their neighbours and a sweep", () => {
  const points = [-0, ...edgePoints()];
  for (let i = 0; i <= 200_000; i++) points.push(Math.fround((460 * i) / 200_000), Math.fround(2 ** (-12 + (12 * i) / 200_000)));
  for (const p of points)
    for (const x of [p, -p]) {
      const got = floatToFp8(x), want = bruteForce(x);
      assert.equal(got, want, `x = ${x}: code ${got}, want ${want}`);
    }
  // a midpoint is a tie: the even code of the two wins (1.0625 = (1 + 1.125) / 2 -> 1.0's code 0x38)
  assert.equal(floatToFp8(1.0625), 0x38);
  assert.equal(floatToFp8(1.1875), 0x3a); // between 1.125 (0x39) and 1.25 (0x3a)
  assert.equal(floatToFp8(-1.1875), 0xba);
  assert.equal(floatToFp8(NaN), 0);
  assert.equal(floatToFp8(500), 126);
});

const native = tryLoadNativeKernels();
test("the native fp8 quantizer gives the same codes at the edge points (a row whose largest magnitude is 448: scale 1)", { skip: !native && "native kernels not built" }, () => {
  const row = Float32Array.from(edgePoints().filter((p) => Math.abs(p) <= 448));
  const data = new Uint8Array(row.length);
  const scales = new Float32Array(1);
  native!.quantizeWeights(row, 1, row.length, 2, data, scales, new Int32Array(0));
  assert.equal(scales[0], 1);
  for (let i = 0; i < row.length; i++) assert.equal(data[i], floatToFp8(row[i]!), `x = ${row[i]}`);
});
