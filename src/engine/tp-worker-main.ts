// A tensor-parallel rank > 0, spawned by rank 0's engine (tensor-parallel.ts; vLLM's multiproc executor worker):
// joins the group, loads its shard of the checkpoint, allocates its KV cache (its KV heads) and runs the forward of
// every step rank 0 broadcasts, until told to stop. argv[2]: TpRankArgs as JSON. Errors go to stderr and, as
// {type: "error"}, to rank 0 before the process exits with status 1.
import { loadModel, type DtypeArg } from "../models/loader.js";
import * as dist from "../distributed/index.js";
import { PagedModelRunner } from "./paged-model-runner.js";
import { followSteps, joinTensorParallel, receiveKvSpec, type TpRankArgs } from "./tensor-parallel.js";

const args = JSON.parse(process.argv[2] ?? "{}") as TpRankArgs;
const tell = (m: { type: string; message?: string }): void => {
  // a send racing rank 0's exit fails with EPIPE: ignored (an unhandled 'error' event would crash with a stack trace)
  if (process.connected) process.send?.(m, undefined, undefined, () => undefined);
};
// rank 0 is gone (killed, or stopped during start-up): nothing is left to serve. Seen while this rank's event loop
// runs (before the rendezvous, while loading); blocked in a collective, the closed connections end it instead.
process.on("disconnect", () => process.exit(1));

/** Resolves on rank 0's "join": it is about to host the rendezvous (joining earlier could wait out the whole timeout). */
function joinMessage(): Promise<void> {
  return new Promise((resolve) => {
    const onMessage = (m: { type?: string }): void => {
      if (m.type !== "join") return;
      process.off("message", onMessage);
      resolve();
    };
    process.on("message", onMessage);
  });
}

async function main(): Promise<void> {
  const join = joinMessage();
  tell({ type: "hello" });
  await join;
  const tp = joinTensorParallel(args);
  const loaded = await loadModel(args.model, {
    dtype: args.dtype as DtypeArg | undefined,
    revision: args.revision,
    tokenizer: args.tokenizer,
    loadFormat: args.loadFormat,
    hfOverrides: args.hfOverrides,
    hfConfigPath: args.hfConfigPath,
    ignorePatterns: args.ignorePatterns,
    skipTokenizer: args.skipTokenizer,
    deferTokenizerBuild: true,
    tp,
    onNote: () => undefined, // rank 0 reports how the weights loaded
  });
  const spec = receiveKvSpec(tp);
  if (spec === null) return dist.destroyProcessGroup();
  loaded.model.setContextLength(spec.maxModelLen);
  const runner = new PagedModelRunner(loaded.model, { numBlocks: spec.numBlocks, blockSize: spec.blockSize, dtype: spec.kvCacheDtype });
  followSteps(tp, (inputs) => runner.forwardInputs(inputs).dispose());
  runner.dispose();
  dist.destroyProcessGroup();
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    const message = err instanceof Error ? err.message : String(err);
    process.stderr.write(`[tensor_parallel] rank ${args.rank}: ${message}\n`);
    tell({ type: "error", message });
    // let the IPC message go out before exiting
    setTimeout(() => process.exit(1), 50);
  },
);
