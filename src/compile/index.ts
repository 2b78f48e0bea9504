// The compiler's public surface: compile(), the traced-op helpers, defer-and-fuse, custom ops, cache stats.
export { compile, type CompileOptions, type CompiledFunction, type CompileStats, type DynamicDim, type CompileArg } from "./compile.js";
export { Sym, GraphBuilder } from "./trace.js";
export type { OpaqueModule } from "./capture.js";
export { rmsNorm, linear, siluMul, where, rotaryEmbedding, type AnyTensor } from "./functional.js";
export { withDeferAndFuse, deferStats } from "./lazy.js";
// importing this module installs the global defer-and-fuse recorder (setEagerMode("defer-and-fuse"))
export { enableDeferAndFuse, deferredPrograms } from "./defer.js";
export { defineOp, type CustomOpDef, type CustomOpFn, type HostKernel } from "./custom-op.js";
export { compileCacheStats, sweep as sweepCompileCache, type CacheStats } from "./cache.js";
export { compiledLaunches, type ProgramInfo } from "./program.js";
export { jitUnavailableReason } from "./jit.js";
export type { Graph, Node, Op } from "./ir.js";
