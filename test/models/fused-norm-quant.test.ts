// Whole-model check of rms_norm and silu·mul fused with activation quantization: a quantized tiny Llama's forward (each
// norm also quantizes its rows once for the q/k/v and gate/up projections, silu·mul for down_proj) equals, bit for
// bit, the unfused forward (each quantized projection quantizes its x itself), on every scheme.
import assert from "node:assert/strict";
import { test } from "node:test";
import { loadLocalModel } from "../../src/models/loader.js";
import { Linear, RMSNorm } from "../../src/nn/layers.js";
import { isGradEnabled, noGrad, tensor, type Tensor } from "../../src/tensor/index.js";
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

// The residual adds fused into the norms after them (vLLM's fused_add_rms_norm): inference (no grad) runs each
// decoder layer's two adds as add_rms_norm kernels (the first layer's input has none to add; the final norm adds the
// last MLP output), and its hidden states and aux residual streams equal the unfused forward's (grad enabled), bit
// for bit, with float32 weights and quantized ones.
test("inference forward: residual adds fused into the next norms == separate adds, bit for bit", () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05 });
  for (const quantization of [null, ...(skip ? [] : (["int8", "int4"] as const))]) {
    const { model } = loadLocalModel(dir, { quantization });
    const [batch, seqLen] = [2, 5];
    const ids = tensor(Int32Array.from({ length: batch * seqLen }, (_, i) => (i * 7 + 3) % 50));
    const positions = tensor(Int32Array.from({ length: batch * seqLen }, (_, i) => i % seqLen));
    const layers = model.namedModules().filter(([name]) => /layers\.\d+$/.test(name)).length;
    const aux = { layers: [0, 1], out: [] as Tensor[] };
    const run = (): { hidden: number[]; aux: number[][]; fusedAdds: number } => {
      const backend = model.device.backend;
      const backendRun = backend.run;
      let fusedAdds = 0;
      backend.run = (call, options) => {
        if (call.op === "add_rms_norm") fusedAdds++;
        return backendRun.call(backend, call, options);
      };
      aux.out = [];
      try {
        const hidden = Array.from(model.forward(ids, { kind: "dense", batch, seqLen, positions }, aux).dataSync() as Float32Array);
        return { hidden, aux: aux.out.map((t) => Array.from(t.dataSync() as Float32Array)), fusedAdds };
      } finally {
        backend.run = backendRun;
      }
    };
    assert.ok(isGradEnabled()); // (the default: forward keeps the separate adds)
    const unfused = run();
    const fused = noGrad(run);
    assert.equal(unfused.fusedAdds, 0);
    assert.equal(fused.fusedAdds, 2 * layers, `${quantization}: add_rms_norm kernels`);
    assert.ok(fused.hidden.every(Number.isFinite));
    const diff = fused.hidden.findIndex((v, i) => v !== unfused.hidden[i]);
    assert.equal(diff, -1, `${quantization}: hidden state ${diff} differs (${fused.hidden[diff]} vs ${unfused.hidden[diff]})`);
    assert.equal(fused.aux.length, 2);
    assert.deepEqual(fused.aux, unfused.aux, `${quantization}: the residual streams entering layers 0 and 1`);
  }
});
