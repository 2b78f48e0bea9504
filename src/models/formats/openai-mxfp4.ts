// MXFP4 as OpenAI's gpt-oss checkpoints store it (HF's `*_blocks` / `*_scales` tensors, quant_method "mxfp4") <->
// Kiln's mxfp4 layout (gguf-repack.ts), moving bits only.
//   OpenAI row of k elements: blocks [k/32][16] bytes, byte j of a block holding its element 2j in the low nibble and
//     2j + 1 in the high one (E2M1 codes: bit 3 sign, bits 2..1 exponent, bit 0 mantissa); scales [k/32] E8M0 bytes,
//     value = E2M1(code) * 2^(scale - 127) (transformers' convert_moe_packed_tensors).
//   Kiln mxfp4 row: per 64-element chunk (two blocks) 32 bytes, byte j holding element j low and 32 + j high; the
//     same E8M0 bytes, one per block.
//   ggml MXFP4 block (GGUF): 17 bytes, the E8M0 byte then qs[16], qs[j] holding element j low and 16 + j high.
import { fitsGroupKernels, type Mxfp4Arrays } from "./gguf-repack.js";

/** E2M1 code -> value (transformers' FP4_VALUES). */
const E2M1 = Float32Array.from([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6]);

/** Code of element p (0..31) of the OpenAI block whose 16 bytes start at `at`. */
const nibble = (src: Uint8Array, at: number, p: number): number => (src[at + (p >> 1)]! >> ((p & 1) << 2)) & 15;

/**
 * The given rows of an OpenAI MXFP4 matrix [n, k] (blocks [n, k/32, 16], scales [n, k/32]) in Kiln's mxfp4 layout,
 * in the order listed (gpt-oss's gate rows are the even ones of gate_up_proj, its up rows the odd ones).
 */
export function openaiMxfp4RowsToKiln(blocks: Uint8Array, scales: Uint8Array, rows: readonly number[], k: number): Mxfp4Arrays {
  if (!fitsGroupKernels(k)) throw new RangeError(`[openaiMxfp4RowsToKiln] mxfp4 needs k % 64 == 0, got ${k}`);
  const data = new Uint8Array((rows.length * k) / 2);
  const out = new Uint8Array((rows.length * k) / 32);
  rows.forEach((row, r) => {
    out.set(scales.subarray((row * k) / 32, ((row + 1) * k) / 32), (r * k) / 32);
    for (let c = 0; c < k / 64; c++) {
      const a = (row * k) / 2 + c * 32; // the chunk's first block (its second follows at a + 16)
      const o = (r * k) / 2 + c * 32;
      for (let j = 0; j < 32; j++) data[o + j] = nibble(blocks, a, j) | (nibble(blocks, a + 16, j) << 4);
    }
  });
  return { data, scales: out };
}

/** Kiln mxfp4 [n, k] -> OpenAI blocks [n, k/32, 16] and scales [n, k/32] (the inverse of openaiMxfp4RowsToKiln). */
export function kilnToOpenaiMxfp4(q: Mxfp4Arrays, n: number, k: number): { blocks: Uint8Array; scales: Uint8Array } {
  if (!fitsGroupKernels(k)) throw new RangeError(`[kilnToOpenaiMxfp4] mxfp4 needs k % 64 == 0, got ${k}`);
  const blocks = new Uint8Array((n * k) / 2);
  for (let c = 0; c < (n * k) / 64; c++)
    for (let j = 0; j < 32; j++) {
      const byte = q.data[c * 32 + j]!;
      for (const [half, code] of [[0, byte & 15], [1, byte >> 4]] as const) {
        const at = c * 32 + half * 16 + (j >> 1); // block 2c (elements < 32) or 2c + 1
        blocks[at] = blocks[at]! | (code << ((j & 1) << 2));
      }
    }
  return { blocks, scales: q.scales.slice() };
}

/** The given rows of an OpenAI MXFP4 matrix [n, k] as float32 [rows.length, k]. */
export function dequantizeOpenaiMxfp4Rows(blocks: Uint8Array, scales: Uint8Array, rows: readonly number[], k: number): Float32Array {
  const out = new Float32Array(rows.length * k);
  rows.forEach((row, r) => {
    for (let b = 0; b < k / 32; b++) {
      const scale = 2 ** (scales[(row * k) / 32 + b]! - 127);
      const at = (row * k) / 2 + b * 16;
      for (let p = 0; p < 32; p++) out[r * k + b * 32 + p] = E2M1[nibble(blocks, at, p)]! * scale;
    }
  });
  return out;
}

/**
 * The given rows of an OpenAI MXFP4 matrix [n, k] (k % 32 == 0) as ggml MXFP4 blocks [rows.length, k/32 * 17], as
 * llama.cpp's converter repacks gpt-oss's experts: the same codes and E8M0 bytes, nibbles moved.
 */
export function openaiMxfp4RowsToGgml(blocks: Uint8Array, scales: Uint8Array, rows: readonly number[], k: number): Uint8Array {
  if (k % 32 !== 0) throw new RangeError(`[openaiMxfp4RowsToGgml] MXFP4 needs k % 32 == 0, got ${k}`);
  const G = k / 32;
  const out = new Uint8Array(rows.length * G * 17);
  rows.forEach((row, r) => {
    for (let g = 0; g < G; g++) {
      const o = (r * G + g) * 17;
      const at = (row * G + g) * 16;
      out[o] = scales[row * G + g]!;
      for (let j = 0; j < 16; j++) out[o + 1 + j] = nibble(blocks, at, j) | (nibble(blocks, at, j + 16) << 4);
    }
  });
  return out;
}
