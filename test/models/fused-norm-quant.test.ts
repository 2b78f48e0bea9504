// Whole-model check of rms_norm and silu·mul fused with activation quantization: a quantized tiny Llama's forward (each
// norm also quantizes its rows once for the q/k/v and gate/up projections, silu·mul for down_proj) equals, bit for
// bit, the unfused forward (each quantized projection quantizes its x itself), on every scheme.
import assert from "node:assert/strict";
import { test } from "node:test";
import { loadLocalModel } from "../../src/models/loader.js";
import { Linear, RMSNorm } from "../../src/nn/layers.js";
import { tensor } from "../../src/tensor/index.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const skip = tryLoadNativeKernels() ? false : "native addon not built";

test("quantized model forward: fused norm + activation quantization == unfused, bit for bit", { skip }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05 });
  for (const quantization of ["int8", "int4", "mxfp4", "fp8"] as const) {
    const { model } = loadLocalModel(dir, { quantization });
    const [batch, seqLen] = [2, 5];
    const ids = tensor(Int32Array.from({ length: batch * seqLen }, (_, i) => (i * 7 + 3) % 50));
    const positions = tensor(Int32Array.from({ length: batch * seqLen }, (_, i) => i % seqLen));
    const run = () => Array.from(model.forward(ids, { kind: "dense", batch, seqLen, positions }).dataSync() as Float32Array);
    let fusedCalls = 0;
    const forwardFor = RMSNorm.prototype.forwardFor;
    const spy = function (this: RMSNorm, ...args: Parameters<RMSNorm["forwardFor"]>) {
      const r = forwardFor.apply(this, args);
      if (r.xq) fusedCalls++;
      return r;
    };
    RMSNorm.prototype.forwardFor = spy;
    // silu·mul fused with the down projection's activation quantization, counted where it reaches the back end
    const backend = model.device.backend;
    const backendRun = backend.run;
    let fusedSiluMul = 0;
    backend.run = (call, options) => {
      if (call.op === "silu_mul" && call.xq) fusedSiluMul++;
      return backendRun.call(backend, call, options);
    };
    let fused: number[];
    try {
      fused = run();
    } finally {
      RMSNorm.prototype.forwardFor = forwardFor;
      backend.run = backendRun;
    }
    // unfused: no layer asks for quantized rows; the quantized projections quantize x themselves
    const takes = Linear.prototype.takesQuantizedActivations;
    Linear.prototype.takesQuantizedActivations = () => false;
    let unfused: number[];
    try {
      unfused = run();
    } finally {
      Linear.prototype.takesQuantizedActivations = takes;
    }
    const layers = model.namedModules().filter(([name]) => /layers\.\d+$/.test(name)).length;
    // fp8 reads f32 activations: nothing is fused, the control case
    assert.equal(fusedCalls, quantization === "fp8" ? 0 : 2 * layers, `${quantization}: norms that quantized their rows`);
    assert.equal(fusedSiluMul, quantization === "fp8" ? 0 : layers, `${quantization}: silu·mul that quantized its rows`);
    assert.ok(fused.every(Number.isFinite));
    const diff = fused.findIndex((v, i) => v !== unfused[i]);
    assert.equal(diff, -1, `${quantization}: hidden state ${diff} differs (${fused[diff]} vs ${unfused[diff]})`);
  }
});
