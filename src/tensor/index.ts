// The tensor runtime's public surface (import * as kiln from "kiln/tensor").
export { Tensor, tensor, empty, unallocated, zeros, ones, full, zerosLike, onesLike, fullLike, arange, fromBytes, fromBytesFilled, mapFromFile, numel, contiguousStrides } from "./tensor.js";
export type { Shape, Scalar, TensorOrScalar, TensorOptions, GradNode } from "./tensor.js";
export { device, defaultDevice, setDefaultDevice, Device, memoryAllocated, maxMemoryAllocated, memoryReserved, maxMemoryReserved, emptyCache, resetPeakMemoryStats, type DeviceLike } from "./device.js";
export { eagerMode, setEagerMode, withEagerMode, type EagerMode } from "./mode.js";
export { noGrad, isGradEnabled, setGradEnabled, registerPostBackwardHook } from "./grad-mode.js";
export { backward, enableAutograd, registerBackward, hasBackward, sumToShape, AutogradNode, type BackwardRule, type BackwardContext } from "./autograd.js";
export type { BackwardOptions } from "./grad-mode.js";
export { kernelsDispatched, flushDeferred, setDeferHook, type DeferHook } from "./dispatch.js";
export * from "./ops/elementwise.js";
export { sum, prod, max, min, amax, amin, argmax, argmin, mean, softmax, logSoftmax, logsumexp, cumsum, sort, topk } from "./ops/reduce.js";
export { matmul, bmm, linear, quantizedEmbedding, quantizedShadowOf, takesQuantizedActivations, type QuantizedActivations } from "./ops/linalg.js";
export { indexSelect, embedding, gather, scatter, indexCopyInto, cat, stack, split, chunk } from "./ops/indexing.js";
export { view, reshape, permute, transpose, narrow, slice, select, expand, squeeze, unsqueeze, flatten, contiguous, clone, broadcastShapes } from "./ops/shape.js";
export {
  rmsNorm, layerNorm, rmsNormQuantized, addRmsNorm, siluMulQuantized, disposeQuantizedActivations, rotaryEmbedding, causalAttention, composedCausalAttention, attentionBias, pagedAttention,
  siluMul, scaledDotProductAttention, enableFlashSdp, flashSdpEnabled, type SdpaOptions, type AttentionMaskOptions, type PagedRotaryArgs,
} from "./ops/nn-functional.js";
export { flashAttention, type FlashAttentionOptions } from "./ops/flash-attention.js";
export { crossEntropy, type CrossEntropyOptions } from "./ops/cross-entropy.js";
export { loraApply } from "./ops/lora.js";
export { moe, type MoeExpert, type MoeProjection } from "./ops/moe.js";
export { tril, triu, diagonal, diag, trace, outer, addmm, baddbmm, type ScaleOptions } from "./ops/matrix.js";
export { einsum } from "./ops/einsum.js";
export { flip, roll, repeat, tile, repeatInterleave, pad, type PadMode } from "./ops/rearrange.js";
export { variance, variance as var, std, varMean, stdMean, norm, isnan, isinf, isfinite, allclose, type VarOptions } from "./ops/statistics.js";
export { lerp, log1p, softplus, logSigmoid, hardtanh, clampMin, clampMax, leakyRelu, elu, dropout } from "./ops/activations.js";
export {
  mseLoss, l1Loss, smoothL1Loss, huberLoss, nllLoss, binaryCrossEntropy, binaryCrossEntropyWithLogits, klDiv,
  type LossReduction, type LossOptions, type NllLossOptions, type BceOptions,
} from "./ops/losses.js";
export { Generator, defaultGenerator, manualSeed, rand, randn, multinomial } from "./ops/random.js";
export type { DType } from "../backends/dtype.js";
export { checkpoint, type CheckpointOptions } from "./checkpoint.js";
export { opSacPolicy, CheckpointPolicyError, type SacOp, type SacDecision, type SacPolicy } from "./selective-checkpoint.js";
export { save, load } from "./serialization.js";
