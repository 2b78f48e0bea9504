// Gemma 3's vision tower on CPU: one SigLIP encoder layer at gemma-3's shapes (hidden 1152, 16 heads of 72, MLP
// 4304, an 896-px image's 4096 patches; random weights), its attention (q/k/v/o projections and the patches' full
// attention) and its MLP timed apart, each as GFLOP/s, next to the same run's matmul rate on the MLP's fc1 shape.
// The attention's kernel work is counted at the head size it runs (72, or padded to 80), the matmuls exactly. The
// whole image's estimate is the layer's time x 27. Run as Gemma3Vision.encode runs it, in a memory pool (fresh
// memory's page faults cost ~10 us per 4 KiB page on this VM). A ratio, not a target: the attention reaches a fraction of the
// GEMM rate because its softmax and online rescaling run between the two products.
// Usage: node dist/bench/vision.js [--rounds 3]   (npm run bench:vision; every core, as the server runs it)
import { SiglipVisionTransformer, type Gemma3VisionConfig } from "../src/models/siglip.js";
import { linear, noGrad, tensor, type Tensor } from "../src/tensor/index.js";

const option = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : dflt;
};
const rounds = Number(option("--rounds", "3"));

const cfg: Gemma3VisionConfig = {
  hiddenSize: 1152, intermediateSize: 4304, numLayers: 1, numHeads: 16, imageSize: 896, patchSize: 14, layerNormEps: 1e-6,
  textHiddenSize: 2560, mmTokensPerImage: 256, imageTokenIndex: 262_144, boiTokenIndex: 255_999, eoiTokenIndex: 256_000,
};
const N = (cfg.imageSize / cfg.patchSize) ** 2;
const [Hd, I, H] = [cfg.hiddenSize, cfg.intermediateSize, cfg.numHeads];
const Dp = Math.ceil(Hd / H / 16) * 16;

let seed = 1;
const random = (n: number): Float32Array => Float32Array.from({ length: n }, () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5) * 0.1);
const tower = new SiglipVisionTransformer(cfg);
for (const [name, p] of tower.namedParameters()) tower.setParameter(name, tensor(random(p.numel), { shape: [...p.shape] }));
const layer = tower.layers[0]!;
const x = tensor(random(N * Hd), { shape: [N, Hd] });
const w1 = tensor(random(I * Hd), { shape: [I, Hd] });

const time = (f: () => Tensor): number => {
  const t0 = performance.now();
  const y = f();
  const first = y.narrow(0, 0, 1); // waits for y without copying it out (a fresh 70 MB array would fault its pages in)
  first.dataSync();
  first.dispose();
  y.dispose();
  return (performance.now() - t0) / 1000;
};
const best = { attn: Infinity, mlp: Infinity, gemm: Infinity };
const backend = x.device.backend;
const measure = (): void => {
  for (let r = 0; r < rounds; r++) {
    best.attn = Math.min(best.attn, time(() => layer.selfAttn.forward(x)));
    best.mlp = Math.min(best.mlp, time(() => layer.mlp.forward(x)));
    best.gemm = Math.min(best.gemm, time(() => linear(x, w1)));
  }
};
// as Gemma3Vision.encode runs the tower: intermediates reuse freed memory (Backend.withMemoryPool)
noGrad(() => (backend.withMemoryPool ? backend.withMemoryPool(measure) : measure()));
const gf = (flops: number, s: number) => (flops / s / 1e9).toFixed(1);
const attnFlops = 4 * 2 * N * Hd * Hd + 2 * 2 * N * N * Dp * H;
const mlpFlops = 2 * 2 * N * Hd * I;
const gemmRate = (2 * N * Hd * I) / best.gemm;
console.log(`SigLIP layer at gemma-3 shapes, ${N} patches, best of ${rounds}:`);
console.log(`  attention ${(best.attn * 1000).toFixed(0)} ms  ${gf(attnFlops, best.attn)} GFLOP/s (${((attnFlops / best.attn / gemmRate) * 100).toFixed(0)}% of the fc1 matmul's rate)`);
console.log(`  mlp       ${(best.mlp * 1000).toFixed(0)} ms  ${gf(mlpFlops, best.mlp)} GFLOP/s (${((mlpFlops / best.mlp / gemmRate) * 100).toFixed(0)}%)`);
console.log(`  fc1 matmul alone ${gf(2 * N * Hd * I, best.gemm)} GFLOP/s`);
console.log(`  27 layers (one image, the norms and residuals left out): ~${(((best.attn + best.mlp) * 27)).toFixed(1)} s`);
