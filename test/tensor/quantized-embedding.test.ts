// quantizedEmbedding (the quant_gather_rows kernel): a quantized table's rows, dequantized exactly as the quantized
// products read them. Oracle: quant-reference.ts's dequantizer over the whole table, row by row.
import assert from "node:assert/strict";
import { test } from "node:test";
import { dequantizeRef } from "../../src/backends/cpu/quant-reference.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import type { QuantScheme } from "../../src/backends/backend.js";
import { tensor } from "../../src/tensor/index.js";
import { quantizedEmbedding, quantizeWeight } from "../../src/tensor/ops/linalg.js";
import { bytesOfTensor, seededRandn } from "../helpers/model-logits.js";

const skip = tryLoadNativeKernels() ? false : "native addon not built";

const SCHEMES: QuantScheme[] = ["int8", "int4", "fp8", "int8_g32", "mxfp4", "q4_k", "q6_k", "q5_k"];

for (const scheme of SCHEMES) {
  test(`quantizedEmbedding (${scheme}): rows ids of the table, as the dequantizer gives them, in the ids' shape`, { skip }, () => {
    const [n, k] = [37, 512];
    const w = seededRandn(n * k, 7 + SCHEMES.indexOf(scheme), 0.3);
    w.fill(0, 5 * k, 5 * k + 64); // a zero group (int4: codes at the zero point of a zero scale)
    const q = quantizeWeight(tensor(w, { shape: [n, k] }), scheme);
    const bytes = bytesOfTensor(q.scales);
    const scales =
      scheme === "int8" || scheme === "fp8" ? new Float32Array(bytes.buffer, bytes.byteOffset, n)
      : scheme === "int4" || scheme === "int8_g32" ? new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2)
      : bytes;
    const table = dequantizeRef(scheme, { data: bytesOfTensor(q.data), scales, rowSums: new Int32Array(0) }, n, k);
    const ids = [36, 0, 5, 5, 17, 1];
    const out = quantizedEmbedding(tensor(Int32Array.from(ids), { shape: [2, 3] }), q);
    assert.deepEqual(out.shape, [2, 3, k]);
    const got = out.dataSync() as Float32Array;
    ids.forEach((id, i) => {
      for (let j = 0; j < k; j++) {
        const want = table[id * k + j]!;
        if (got[i * k + j] !== want) assert.fail(`id ${id} element ${j}: ${got[i * k + j]} vs ${want}`);
      }
    });
    // the values stand for the weight: within the scheme's rounding of it
    const err = Math.max(...ids.map((id) => Math.max(...Array.from({ length: k }, (_, j) => Math.abs(got[ids.indexOf(id) * k + j]! - w[id * k + j]!)))));
    assert.ok(err < 0.25, `${scheme}: max error ${err} against the float weight`);
    assert.throws(() => quantizedEmbedding(tensor(Int32Array.of(3, n)), q).dataSync(), (e: Error) => e.name === "IndexOutOfRangeError" && /^\[quantized_embedding\] id 37 out of range \[0, 37\)/.test(e.message));
    assert.throws(() => quantizedEmbedding(tensor(Float32Array.of(1)), q), /ids must be int32/);
  });
}
