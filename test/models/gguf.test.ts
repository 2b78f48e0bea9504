import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { readGguf, writeGguf, gguf, GgufValueType, ModelFormatError } from "../../src/models/formats/gguf.js";
import { dequantize, quantizeQ4_0, quantizeQ8_0 } from "../../src/models/formats/gguf-quant.js";
import { f16BitsToF32, f32ToF16Bits } from "../../src/models/formats/dtype-convert.js";
import { permuteQK, unpermuteQK, hfToGgufTensorName, ggufToHfTensorName, hfConfigToGgufMetadata, ggufToHfConfig, llama3RopeFreqs } from "../../src/models/formats/gguf-mapping.js";
import { parseHfConfig } from "../../src/models/hf-config.js";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-gguf-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));

function ramp(n: number, scale = 1): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * scale);
}

test("GGUF round trip: metadata of every type, F32/F16/Q8_0/Q4_0 tensors", () => {
  const file = path.join(tmp, "rt.gguf");
  const a = ramp(64 * 4);
  writeGguf(file, {
    "general.architecture": gguf.str("llama"),
    "general.alignment": gguf.u32(64),
    "u32": gguf.u32(7), "i32": gguf.i32(-7), "f32": gguf.f32(0.5), "bool": gguf.bool(true),
    "u64": gguf.u64(2n ** 60n), "str": "héllo ✓",
    "u8": { type: GgufValueType.UINT8, value: 255 }, "i16": { type: GgufValueType.INT16, value: -300 },
    "f64": { type: GgufValueType.FLOAT64, value: Math.PI },
    "arr.str": gguf.array(GgufValueType.STRING, ["a", "", "c d"]),
    "arr.f32": gguf.array(GgufValueType.FLOAT32, [0, 1.5, -2]),
    "arr.nested": gguf.array(GgufValueType.ARRAY, [[1, 2], [3]]),
  }, [
    { name: "f32", shape: [4, 64], type: "F32", data: a },
    { name: "f16", shape: [4, 64], type: "F16", data: a },
    { name: "q8", shape: [4, 64], type: "Q8_0", data: a },
    { name: "q4", shape: [4, 64], type: "Q4_0", data: a },
    { name: "vec", shape: [3], type: "F32", data: new Float32Array([1, 2, 3]) },
  ]);
  const g = readGguf(file);
  assert.equal(g.version, 3);
  assert.equal(g.alignment, 64);
  assert.equal(g.dataOffset % 64, 0);
  const md = g.metadata;
  assert.equal(md.u32, 7); assert.equal(md.i32, -7); assert.equal(md.f32, 0.5); assert.equal(md.bool, true);
  assert.equal(md.u64, 2n ** 60n); assert.equal(md.str, "héllo ✓"); assert.equal(md.u8, 255); assert.equal(md.i16, -300);
  assert.equal(md.f64, Math.PI);
  assert.deepEqual(md["arr.str"], ["a", "", "c d"]);
  assert.deepEqual(md["arr.f32"], [0, 1.5, -2]);
  assert.deepEqual(md["arr.nested"], [[1, 2], [3]]);
  assert.deepEqual(g.metadataTypes["arr.f32"], { type: GgufValueType.ARRAY, arrayType: GgufValueType.FLOAT32 });
  const q8 = g.get("q8")!;
  assert.deepEqual(q8.dims, [64, 4]);
  assert.deepEqual(q8.shape, [4, 64]);
  assert.equal(q8.byteLength, 8 * 34);
  for (const t of g.tensors) assert.equal(t.byteOffset % 64, 0);
  assert.deepEqual(g.loadAsFloat32("f32"), a);
  assert.deepEqual(g.loadAsFloat32("vec"), new Float32Array([1, 2, 3]));
  const f16 = g.loadAsFloat32("f16");
  a.forEach((v, i) => assert.ok(Math.abs(f16[i]! - v) <= Math.abs(v) * 2 ** -11 + 2 ** -24));
  // Q8_0: error <= d/2 plus the f16 rounding of d (|q| <= 127 times relative 2^-11).
  const q8v = g.loadAsFloat32("q8");
  const q4v = g.loadAsFloat32("q4");
  for (let b = 0; b < a.length / 32; b++) {
    const blk = a.subarray(b * 32, b * 32 + 32);
    const amax = Math.max(...Array.from(blk, Math.abs));
    for (let j = 0; j < 32; j++) {
      const i = b * 32 + j;
      assert.ok(Math.abs(q8v[i]! - a[i]!) <= amax / 254 + amax * 2 ** -10, `q8 ${i}`);
      assert.ok(Math.abs(q4v[i]! - a[i]!) <= amax / 8 + amax * 2 ** -9, `q4 ${i}`); // step |d| = amax/8, clamp at top
    }
  }
  // typed metadata survives a rewrite
  const file2 = path.join(tmp, "rt2.gguf");
  writeGguf(file2, g.typedMetadata(), [{ name: "q8", shape: [4, 64], type: "Q8_0", raw: g.load("q8") }]);
  const g2 = readGguf(file2);
  assert.deepEqual(g2.metadata, g.metadata);
  assert.deepEqual(g2.load("q8"), g.load("q8"));
  g.close();
  g2.close();
});

test("Q8_0 and Q4_0 quantization match hand-computed values", () => {
  // amax 127 -> d = 1 exactly; roundf rounds halves away from zero.
  const x = new Float32Array(32);
  x.set([127, -64, 3.4, 2.5, -2.5, 0.49, -126.6]);
  const q8 = quantizeQ8_0(x);
  assert.equal(q8[0]! | (q8[1]! << 8), 0x3c00); // d = 1.0 in f16
  assert.deepEqual(Array.from(new Int8Array(q8.buffer, 2, 7)), [127, -64, 3, 3, -3, 0, -127]);
  assert.deepEqual(Array.from(dequantize("Q8_0", q8, 32)!.subarray(0, 7)), [127, -64, 3, 3, -3, 0, -127]);
  // Q4_0: the largest-magnitude value is -8 -> d = -8 / -8 = 1; q = min(15, trunc(x/d + 8.5)).
  const y = new Float32Array(32);
  y.set([-8, 7, 7.6, 0.4, 0.5, -0.5, 3.2, -3.7]);
  const q4 = quantizeQ4_0(y);
  assert.equal(q4[0]! | (q4[1]! << 8), 0x3c00);
  assert.deepEqual(Array.from(dequantize("Q4_0", q4, 32)!.subarray(0, 8)), [-8, 7, 7, 0, 1, 0, 3, -4]); // -3.7 + 8.5 = 4.8 -> 4 -> -4
  // element j sits in the low nibble of byte j, element j+16 in the high nibble
  y.fill(0); y[16] = -8; y[0] = 1;
  const q4b = quantizeQ4_0(y);
  assert.equal(q4b[2], 9 | (0 << 4));
});

test("Q4_K dequantization of a hand-built block", () => {
  const blk = new Uint8Array(144);
  const put16 = (o: number, v: number) => { const h = f32ToF16Bits(v); blk[o] = h & 0xff; blk[o + 1] = h >> 8; };
  put16(0, 1.0); // d
  put16(2, 0.5); // dmin
  // 6-bit scales sc = [2,3,4,5,17,0,3,0], mins m = [1,0,2,0,2,0,1,15]; sc[4]'s high bits come from byte 0's top bits.
  blk.set([2 | (1 << 6), 3, 4, 5, 1, 0, 2, 0, 0x21, 0x00, 0x13, 0xf0], 4);
  for (let i = 0; i < 128; i++) blk[16 + i] = i; // low nibble i%16, high nibble i>>4
  const y = dequantize("Q4_K", blk, 256)!;
  // y = d*sc*q - dmin*m, sub-block k uses low nibbles (k even) or high nibbles (k odd) of qs[32*(k>>1) ..]
  assert.equal(y[0], -0.5); // 2*0 - 0.5*1
  assert.equal(y[5], 9.5); // 2*5 - 0.5
  assert.equal(y[32 + 17], 3); // 3 * (17>>4)
  assert.equal(y[64], -1); // 4*0 - 0.5*2
  assert.equal(y[64 + 15], 59); // 4*15 - 1
  assert.equal(y[96 + 3], 10); // 5 * (35>>4)
  assert.equal(y[128 + 1], 16); // 17*1 - 0.5*2
  assert.equal(y[160 + 31], 0); // sc 0, m 0
  assert.equal(y[192 + 10], 29.5); // 3*10 - 0.5
  assert.equal(y[224 + 20], -7.5); // 0 - 0.5*15
});

test("Q6_K dequantization of a hand-built block", () => {
  const blk = new Uint8Array(210);
  blk.fill(0x21, 0, 128); // ql: low nibble 1, high nibble 2
  blk.fill(0xe4, 128, 192); // qh 2-bit fields: 0, 1, 2, 3
  for (let i = 0; i < 16; i++) blk[192 + i] = (i - 8) & 0xff; // int8 scales -8..7
  const h = f32ToF16Bits(0.5);
  blk[208] = h & 0xff; blk[209] = h >> 8;
  const y = dequantize("Q6_K", blk, 256)!;
  // q1 = (1|0<<4)-32 = -31, q2 = (1|1<<4)-32 = -15, q3 = (2|2<<4)-32 = 2, q4 = (2|3<<4)-32 = 18
  assert.equal(y[0], 124); // 0.5 * -8 * -31
  assert.equal(y[16], 108.5); // 0.5 * -7 * -31
  assert.equal(y[32], 45); // 0.5 * -6 * -15
  assert.equal(y[64 + 20], -3); // 0.5 * sc[5]=-3 * 2
  assert.equal(y[96 + 31], -9); // 0.5 * sc[7]=-1 * 18
  assert.equal(y[128 + 16], -15.5); // 0.5 * sc[9]=1 * -31
  assert.equal(y[128 + 96 + 17], 63); // 0.5 * sc[15]=7 * 18
});

test("Q4_1 / Q5_0 dequantization of hand-built blocks", () => {
  const q41 = new Uint8Array(20);
  q41.set([0x00, 0x3c, 0x00, 0xbc]); // d = 1, m = -1
  q41[4] = 0x52; // element 0 -> 2, element 16 -> 5
  const y = dequantize("Q4_1", q41, 32)!;
  assert.equal(y[0], 1); assert.equal(y[16], 4); assert.equal(y[1], -1);
  const q50 = new Uint8Array(22);
  q50.set([0x00, 0x3c]); // d = 1
  q50.set([0x01, 0x00, 0x01, 0x00], 2); // qh bit 0 (element 0) and bit 16 (element 16)
  q50[6] = 0x3f; // element 0 low nibble 15, element 16 high nibble 3
  const z = dequantize("Q5_0", q50, 32)!;
  assert.equal(z[0], 15); // (15|16) - 16
  assert.equal(z[16], 3); // (3|16) - 16
  assert.equal(z[1], -16);
});

/** Builds a GGUF header by hand for hostile-file tests. */
function hostile(name: string, build: (w: (bytes: number[] | bigint, size?: 4 | 8) => void) => void): string {
  const parts: number[] = [];
  const w = (v: number[] | bigint, size: 4 | 8 = 8) => {
    if (Array.isArray(v)) parts.push(...v);
    else {
      const b = new Uint8Array(size);
      const dv = new DataView(b.buffer);
      if (size === 4) dv.setUint32(0, Number(v), true); else dv.setBigUint64(0, v, true);
      parts.push(...b);
    }
  };
  build(w);
  const file = path.join(tmp, name);
  fs.writeFileSync(file, Uint8Array.from(parts));
  return file;
}
const magic = [0x47, 0x47, 0x55, 0x46];
const str = (s: string) => [...new Uint8Array(new BigUint64Array([BigInt(s.length)]).buffer), ...new TextEncoder().encode(s)];

const hostileCases: [string, () => string, RegExp][] = [
  ["bad magic", () => hostile("magic.gguf", (w) => { w([0x47, 0x47, 0x4a, 0x46]); w(3n, 4); w(0n); w(0n); }), /bad magic/],
  ["unsupported version", () => hostile("ver.gguf", (w) => { w(magic); w(1n, 4); w(0n); w(0n); }), /version 1/],
  ["big-endian file", () => hostile("be.gguf", (w) => { w(magic); w([0, 0, 0, 3]); w(0n); w(0n); }), /big-endian/],
  ["huge tensor count", () => hostile("tc.gguf", (w) => { w(magic); w(3n, 4); w(1n << 60n); w(0n); }), /tensor count/],
  ["huge kv count", () => hostile("kc.gguf", (w) => { w(magic); w(3n, 4); w(0n); w(1n << 40n); }), /kv count/],
  ["huge string length", () => hostile("sl.gguf", (w) => { w(magic); w(3n, 4); w(0n); w(1n); w(1n << 62n); w(new Array(32).fill(0x61)); }), /length \d+ exceeds/],
  ["huge array length", () => hostile("al.gguf", (w) => { w(magic); w(3n, 4); w(0n); w(1n); w(str("k")); w(9n, 4); w(4n, 4); w(1n << 50n); }), /array length/],
  ["unknown value type", () => hostile("vt.gguf", (w) => { w(magic); w(3n, 4); w(0n); w(1n); w(str("k")); w(99n, 4); w([0, 0, 0, 0]); }), /unknown value type 99/],
  ["unknown ggml type", () => hostile("gt.gguf", (w) => { w(magic); w(3n, 4); w(1n); w(0n); w(str("w")); w(1n, 4); w(32n); w(77n, 4); w(0n); w(new Array(64).fill(0)); }), /"w".*unknown ggml type 77/],
  ["tensor data past EOF", () => hostile("eof.gguf", (w) => { w(magic); w(3n, 4); w(1n); w(0n); w(str("w")); w(1n, 4); w(1024n); w(0n, 4); w(0n); w(new Array(64).fill(0)); }), /"w".*past the end/],
  ["too many dims", () => hostile("dims.gguf", (w) => { w(magic); w(3n, 4); w(1n); w(0n); w(str("w")); w(9n, 4); w(new Array(64).fill(0)); }), /n_dims 9/],
  ["dims product overflows", () => hostile("prod.gguf", (w) => { w(magic); w(3n, 4); w(1n); w(0n); w(str("w")); w(2n, 4); w(1n << 40n); w(1n << 40n); w(0n, 4); w(0n); w(new Array(64).fill(0)); }), /overflows/],
  // a 0-d Q8_0 tensor was read as 34/32 bytes (the row check skipped 0-d tensors); ggml's reader refuses it too
  ["0-d quantized tensor", () => hostile("q0d.gguf", (w) => { w(magic); w(3n, 4); w(1n); w(0n); w(str("s")); w(0n, 4); w(8n, 4); w(0n); w(new Array(64).fill(0)); }), /"s".*row length 1 is not a multiple of the Q8_0 block size 32/],
  ["unaligned tensor offset", () => hostile("align.gguf", (w) => { w(magic); w(3n, 4); w(1n); w(0n); w(str("w")); w(1n, 4); w(1n); w(0n, 4); w(3n); w(new Array(64).fill(0)); }), /alignment/],
];
for (const [label, make, re] of hostileCases) {
  test(`malformed GGUF: ${label}`, () => {
    const file = make();
    const t0 = Date.now();
    assert.throws(() => readGguf(file), (e: unknown) => e instanceof ModelFormatError && e.message.includes(file) && re.test(e.message));
    assert.ok(Date.now() - t0 < 1000);
  });
}

test("malformed GGUF: truncated valid file", () => {
  const file = path.join(tmp, "full.gguf");
  writeGguf(file, { "general.architecture": "llama", "arr": gguf.array(GgufValueType.STRING, ["x".repeat(100), "y"]) }, [{ name: "w", shape: [2, 32], type: "F32", data: ramp(64) }]);
  const bytes = fs.readFileSync(file);
  for (const cut of [10, 30, 100, bytes.length - 8]) {
    const f = path.join(tmp, `cut${cut}.gguf`);
    fs.writeFileSync(f, bytes.subarray(0, cut));
    assert.throws(() => readGguf(f), (e: unknown) => e instanceof ModelFormatError && e.message.includes(f));
  }
});

test("permuteQK matches convert_hf_to_gguf's reshape/swapaxes and unpermuteQK inverts it", () => {
  // 2 heads of head_dim 4, 1 column: HF rows per head [a0 a1 b0 b1] -> GGUF [a0 b0 a1 b1]
  const w = Float32Array.from([0, 1, 2, 3, 10, 11, 12, 13]);
  assert.deepEqual(Array.from(permuteQK(w, 8, 2)), [0, 2, 1, 3, 10, 12, 11, 13]);
  const k = Float32Array.from({ length: 16 * 3 }, (_, i) => i); // 16 rows = 2 kv heads of 8, 3 cols
  const pk = permuteQK(k, 16, 8, 2);
  assert.deepEqual(Array.from(pk.subarray(3, 6)), [12, 13, 14]); // row 1 <- row 4 (head 0, second half, i = 0)
  assert.deepEqual(unpermuteQK(pk, 16, 8, 2), k);
  const bf = Uint16Array.from({ length: 32 * 5 }, (_, i) => i);
  assert.deepEqual(unpermuteQK(permuteQK(bf, 32, 4), 32, 4), bf);
});

test("tensor name mapping HF <-> GGUF", () => {
  const pairs: [string, string][] = [
    ["model.embed_tokens.weight", "token_embd.weight"], ["model.norm.weight", "output_norm.weight"], ["lm_head.weight", "output.weight"],
    ["model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"], ["model.layers.3.self_attn.k_proj.bias", "blk.3.attn_k.bias"],
    ["model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight"], ["model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"],
    ["model.layers.1.self_attn.q_norm.weight", "blk.1.attn_q_norm.weight"], ["model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"],
    ["model.layers.2.mlp.gate_proj.weight", "blk.2.ffn_gate.weight"], ["model.layers.2.mlp.up_proj.weight", "blk.2.ffn_up.weight"],
    ["model.layers.2.mlp.down_proj.weight", "blk.2.ffn_down.weight"], ["model.layers.2.input_layernorm.weight", "blk.2.attn_norm.weight"],
    ["model.layers.2.post_attention_layernorm.weight", "blk.2.ffn_norm.weight"], ["model.layers.5.mlp.gate.weight", "blk.5.ffn_gate_inp.weight"],
  ];
  for (const [hf, g] of pairs) {
    assert.deepEqual(hfToGgufTensorName(hf), { name: g });
    assert.equal(ggufToHfTensorName(g), hf);
  }
  assert.deepEqual(hfToGgufTensorName("model.layers.4.mlp.experts.7.down_proj.weight"), { name: "blk.4.ffn_down_exps.weight", expert: 7 });
  assert.deepEqual(hfToGgufTensorName("model.layers.4.block_sparse_moe.experts.1.w1.weight"), { name: "blk.4.ffn_gate_exps.weight", expert: 1 });
  assert.deepEqual(hfToGgufTensorName("model.layers.4.block_sparse_moe.gate.weight"), { name: "blk.4.ffn_gate_inp.weight" });
  assert.equal(ggufToHfTensorName("blk.4.ffn_up_exps.weight", "mixtral"), "model.layers.4.block_sparse_moe.experts.{expert}.w3.weight");
  assert.equal(ggufToHfTensorName("blk.4.ffn_up_exps.weight"), "model.layers.4.mlp.experts.{expert}.up_proj.weight");
  assert.equal(hfToGgufTensorName("model.layers.0.self_attn.rotary_emb.inv_freq"), null);
});

test("HF config <-> GGUF metadata", () => {
  const qwen3 = {
    architectures: ["Qwen3MoeForCausalLM"], vocab_size: 1000, hidden_size: 64, intermediate_size: 128, moe_intermediate_size: 32,
    num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 32, rms_norm_eps: 1e-6, rope_theta: 1e6,
    max_position_embeddings: 4096, num_experts: 8, num_experts_per_tok: 2, norm_topk_prob: true,
    rope_scaling: { rope_type: "yarn", factor: 4, original_max_position_embeddings: 1024 }, eos_token_id: 5,
  };
  const md = hfConfigToGgufMetadata(qwen3);
  assert.deepEqual(md["general.architecture"], gguf.str("qwen3moe"));
  assert.deepEqual(md["qwen3moe.attention.head_count_kv"], gguf.u32(2));
  assert.deepEqual(md["qwen3moe.attention.key_length"], gguf.u32(32));
  assert.deepEqual(md["qwen3moe.expert_feed_forward_length"], gguf.u32(32));
  const file = path.join(tmp, "cfg.gguf");
  writeGguf(file, md, []);
  const back = parseHfConfig(ggufToHfConfig(readGguf(file).metadata, ["token_embd.weight"]));
  const orig = parseHfConfig(qwen3);
  for (const k of ["architecture", "hiddenSize", "numHiddenLayers", "numAttentionHeads", "numKeyValueHeads", "headDim", "ropeTheta", "maxPositionEmbeddings", "moe", "ropeScaling", "vocabSize"] as const) {
    assert.deepEqual(back[k], orig[k], k);
  }
  assert.equal(back.tieWordEmbeddings, true);
  assert.ok(Math.abs(back.rmsNormEps - 1e-6) < 1e-12);
  const mixtral = ggufToHfConfig({ "general.architecture": "llama", "llama.embedding_length": 64, "llama.feed_forward_length": 96, "llama.block_count": 1, "llama.attention.head_count": 4, "llama.expert_count": 8, "llama.expert_used_count": 2 });
  assert.deepEqual(mixtral.architectures, ["MixtralForCausalLM"]);
  const freqs = llama3RopeFreqs({ hidden_size: 64, num_attention_heads: 2, rope_theta: 500000, rope_scaling: { factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 } });
  assert.equal(freqs.length, 16);
  assert.equal(freqs[0], 1); // highest frequency: unscaled
  assert.equal(freqs[15], 8); // lowest frequency: divided by factor
});

test("f16 helpers agree on every finite f16", () => {
  for (let h = 0; h < 0x10000; h++) {
    const v = f16BitsToF32(h);
    if (Number.isFinite(v) && h !== 0x8000) assert.equal(f32ToF16Bits(v), h);
  }
});
