// Tensor-parallel serving, as vLLM's multiproc executor runs it: rank 0 (the engine) spawns ranks 1..N-1 as processes
// (tp-worker-main.ts), joins them in a gloo group on a free 127.0.0.1 port, and each rank loads its shard of the
// checkpoint (heads, KV heads and MLP features split; see nn/parallel.ts). Each eager step, rank 0 broadcasts the
// step's flat inputs (StepInputs: ids, positions, slots, block tables) and every rank runs the same forward on its
// shard, meeting at the row-parallel all-reduces; only rank 0 computes logits and samples.
//
// Wire format (two broadcasts per step): a header int32[8] = [kind, T, numSeqs, maxBlocks, hasLora, ...], then for a
// step one int32 payload (ids | positions | slots | tables | queryStart | seqLens | loraSlots).
import { fork, type ChildProcess } from "node:child_process";
import * as fs from "node:fs";
import { createServer } from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import * as dist from "../distributed/index.js";
import { tensorParallelOf, type TensorParallel } from "../nn/parallel.js";
import type { LoadFormat } from "../models/load-format.js";
import { tensor } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";
import type { KvCacheDtype, StepInputs } from "./paged-model-runner.js";

/** A rank that died or failed: the engine cannot go on (its shard of every layer is gone). */
export class TensorParallelRankError extends KilnError {
  override name = "TensorParallelRankError";
}

const HEADER = 8;
const KIND_STEP = 1;
const KIND_STOP = 2;
const KIND_KV_SPEC = 3;
const KV_DTYPES: readonly KvCacheDtype[] = ["float32", "bfloat16", "fp8_e4m3", "fp8_e5m2"];
/**
 * Collectives' timeout: the other ranks wait for rank 0's next step as long as the server idles, so it is long; a rank
 * that dies is noticed at once anyway (its connections close: "Connection closed by peer").
 */
const TP_TIMEOUT_MS = 7 * 24 * 3600 * 1000;

/** What a spawned rank needs to load its shard (serialized into its argv). */
export interface TpRankArgs {
  model: string;
  dtype?: string;
  revision?: string;
  tokenizer?: string;
  /** How rank 0 reads the model (models/load-format.ts): every rank must build the same one. */
  loadFormat?: LoadFormat;
  hfOverrides?: Record<string, unknown>;
  /** --hf-config-path, --ignore-patterns and --skip-tokenizer-init, as rank 0 reads the model. */
  hfConfigPath?: string;
  ignorePatterns?: string[];
  skipTokenizer?: boolean;
  rank: number;
  worldSize: number;
  initMethod: string;
}

/** The KV cache every rank allocates (each with its own KV heads), sent by rank 0 once it has sized it. */
export interface TpKvSpec {
  numBlocks: number;
  blockSize: number;
  kvCacheDtype: KvCacheDtype;
  maxModelLen: number;
}

function broadcastInts(values: Int32Array, tp: TensorParallel): Int32Array {
  const t = tensor(values);
  dist.broadcast(t, tp.group.ranks[0]!, tp.group);
  const out = Int32Array.from(t.dataSync() as Int32Array);
  t.dispose();
  return out;
}

/** Rank 0's side: the group, the spawned ranks, and the per-step broadcast. */
export class TpLeader {
  private failure: Error | null = null;
  private readonly listeners: ((err: Error) => void)[] = [];
  private stopping = false;
  private readonly lastError = new Map<number, string>();

  constructor(
    readonly tp: TensorParallel,
    private readonly ranks: { rank: number; child: ChildProcess }[],
  ) {
    for (const { rank, child } of ranks) {
      child.on("message", (m: { type?: string; message?: string }) => {
        if (m.type === "error" && typeof m.message === "string") this.lastError.set(rank, m.message);
      });
      child.on("exit", (code, signal) => {
        if (this.stopping) return;
        this.fail(new TensorParallelRankError(`[tensor_parallel] rank ${rank} (pid ${child.pid}) exited (${signal ?? `code ${code}`})${this.detail(rank)}`));
      });
    }
  }

  private detail(rank: number): string {
    const e = this.lastError.get(rank);
    return e === undefined ? "" : `: ${e}`;
  }

  private fail(err: Error): void {
    if (this.failure !== null) return;
    this.failure = err;
    for (const l of this.listeners) l(err);
  }

  /** Calls `listener` once when a rank dies while the engine runs (e.g. idle, between steps). */
  onFailure(listener: (err: Error) => void): void {
    if (this.failure !== null) listener(this.failure);
    else this.listeners.push(listener);
  }

  /**
   * The error to report for `err` thrown by a step: when a rank has died, an error naming it; else err. Checked
   * synchronously (the exit event may not have run yet), waiting up to `waitMs` for a transport error's cause: a
   * killed rank's sockets close moments before it becomes a zombie.
   */
  explain(err: unknown, waitMs = 1000): unknown {
    if (this.failure !== null) return this.failure;
    const transport = err instanceof dist.DistributedBackendError;
    const deadline = Date.now() + (transport ? waitMs : 0);
    for (;;) {
      const dead = this.ranks.find(({ child }) => child.exitCode !== null || child.signalCode !== null || processGone(child.pid!));
      if (dead !== undefined) {
        const cause = err instanceof Error ? err.message : String(err);
        return new TensorParallelRankError(`[tensor_parallel] rank ${dead.rank} (pid ${dead.child.pid}) died during a step${this.detail(dead.rank)} (${cause})`);
      }
      if (Date.now() >= deadline) return err;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20); // a fatal path: a short blocking wait is fine
    }
  }

  broadcastKvSpec(spec: TpKvSpec): void {
    const h = new Int32Array(HEADER);
    h.set([KIND_KV_SPEC, spec.numBlocks, spec.blockSize, KV_DTYPES.indexOf(spec.kvCacheDtype), spec.maxModelLen]);
    broadcastInts(h, this.tp);
  }

  /** Sends one step's inputs to the other ranks (they then run its forward with this rank). */
  broadcastStep(inputs: StepInputs): void {
    if (this.failure !== null) throw this.failure;
    const numSeqs = inputs.seqLens.length;
    const T = inputs.ids.length;
    const maxBlocks = numSeqs === 0 ? 0 : inputs.blockTables.length / numSeqs;
    const h = new Int32Array(HEADER);
    h.set([KIND_STEP, T, numSeqs, maxBlocks, inputs.loraSlots === null ? 0 : 1]);
    broadcastInts(h, this.tp);
    const parts = [inputs.ids, inputs.positions, inputs.slotMapping, inputs.blockTables, inputs.queryStart, inputs.seqLens];
    if (inputs.loraSlots !== null) parts.push(inputs.loraSlots);
    const payload = new Int32Array(parts.reduce((n, p) => n + p.length, 0));
    parts.reduce((at, p) => (payload.set(p, at), at + p.length), 0);
    broadcastInts(payload, this.tp);
  }

  /**
   * Stops the other ranks (a stop message, then SIGKILL after `graceMs`) and leaves the group. `graceful` false (after
   * a failed step, when the ranks may sit in a collective this one left) kills them without a message.
   */
  async shutdown(graceMs = 3000, graceful = true): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    if (!graceful) this.ranks.forEach(({ child }) => child.kill("SIGKILL"));
    else if (this.failure === null) {
      try {
        const h = new Int32Array(HEADER);
        h[0] = KIND_STOP;
        broadcastInts(h, this.tp);
      } catch {
        // a rank already gone: the kill below covers the rest
      }
    }
    dist.destroyProcessGroup();
    await Promise.all(
      this.ranks.map(({ child }) => {
        if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
        return new Promise<void>((resolve) => {
          const timer = setTimeout(() => {
            child.kill("SIGKILL");
            resolve();
          }, graceMs);
          child.once("exit", () => {
            clearTimeout(timer);
            resolve();
          });
        });
      }),
    );
  }
}

/** Whether process `pid` has exited (a zombie not yet reaped counts: its exit event has not run). */
function processGone(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state === "Z" || state === "X";
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT" && fs.existsSync("/proc/self/stat")) return true;
  }
  try {
    process.kill(pid, 0); // no /proc: a zombie still counts as alive here
    return false;
  } catch {
    return true;
  }
}

/** A free TCP port on 127.0.0.1 (closed again at once: rank 0's store binds it moments later). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

/** The compiled follower script next to this file. */
function workerScript(): string {
  return path.join(path.dirname(fileURLToPath(import.meta.url)), "tp-worker-main.js");
}

/**
 * Spawns ranks 1..worldSize-1, waits until each has started, and joins them in a gloo group as rank 0. A rank that
 * exits before joining fails this with a TensorParallelRankError naming it (its stderr is the caller's).
 */
export async function startTensorParallel(args: Omit<TpRankArgs, "rank" | "worldSize" | "initMethod">, worldSize: number): Promise<TpLeader> {
  if (dist.isInitialized()) throw new TensorParallelRankError("[tensor_parallel] this process already belongs to a process group");
  const port = await freePort();
  const initMethod = `tcp://127.0.0.1:${port}`;
  // each rank's native thread pool gets its share of the cores (rank 0's is already sized)
  const threads = String(Math.max(1, Math.floor(os.availableParallelism() / worldSize)));
  const script = workerScript();
  if (!fs.existsSync(script)) throw new TensorParallelRankError(`[tensor_parallel] ${script} is missing (build the package)`);
  const ranks = Array.from({ length: worldSize - 1 }, (_, i) => {
    const rankArgs: TpRankArgs = { ...args, rank: i + 1, worldSize, initMethod };
    const child = fork(script, [JSON.stringify(rankArgs)], {
      stdio: ["ignore", "inherit", "inherit", "ipc"],
      env: { ...process.env, KILN_NUM_THREADS: process.env.KILN_NUM_THREADS ?? threads },
      execArgv: [],
    });
    return { rank: i + 1, child };
  });
  const kill = (): void => ranks.forEach(({ child }) => child.kill("SIGKILL"));
  try {
    await Promise.all(
      ranks.map(
        ({ rank, child }) =>
          new Promise<void>((resolve, reject) => {
            let last = "";
            child.on("message", (m: { type?: string; message?: string }) => {
              if (m.type === "hello") resolve();
              if (m.type === "error") last = `: ${m.message}`;
            });
            child.once("error", (e) => reject(new TensorParallelRankError(`[tensor_parallel] rank ${rank} failed to start: ${e.message}`)));
            child.once("exit", (code, signal) => reject(new TensorParallelRankError(`[tensor_parallel] rank ${rank} exited during start-up (${signal ?? `code ${code}`})${last}`)));
          }),
      ),
    );
    // a rank enters the (blocking) rendezvous only when told: until then it notices rank 0 dying (its IPC channel
    // closes) and exits, where blocked in the store's connect loop it would outlive rank 0 by the 7-day timeout
    await Promise.all(
      ranks.map(
        ({ rank, child }) =>
          new Promise<void>((resolve, reject) =>
            child.send({ type: "join" }, (e) => (e ? reject(new TensorParallelRankError(`[tensor_parallel] rank ${rank} went away during start-up: ${e.message}`)) : resolve())),
          ),
      ),
    );
  } catch (e) {
    kill();
    throw e;
  }
  let group: dist.ProcessGroup;
  try {
    group = dist.initProcessGroup({ backend: "gloo", initMethod, rank: 0, worldSize, timeoutMs: TP_TIMEOUT_MS, consistencyChecks: false });
  } catch (e) {
    kill();
    throw e;
  }
  return new TpLeader(tensorParallelOf(group), ranks);
}

/** A spawned rank's side: joins the group (after telling rank 0 it started), then returns its place in it. */
export function joinTensorParallel(args: TpRankArgs): TensorParallel {
  const group = dist.initProcessGroup({
    backend: "gloo", initMethod: args.initMethod, rank: args.rank, worldSize: args.worldSize, timeoutMs: TP_TIMEOUT_MS, consistencyChecks: false,
  });
  return tensorParallelOf(group);
}

/** A spawned rank waits for rank 0's KV cache spec (null: rank 0 failed to load and stops the ranks). */
export function receiveKvSpec(tp: TensorParallel): TpKvSpec | null {
  const h = broadcastInts(new Int32Array(HEADER), tp);
  if (h[0] === KIND_STOP) return null;
  if (h[0] !== KIND_KV_SPEC) throw new TensorParallelRankError(`[tensor_parallel] expected the KV cache spec from rank 0, got message kind ${h[0]}`);
  return { numBlocks: h[1]!, blockSize: h[2]!, kvCacheDtype: KV_DTYPES[h[3]!]!, maxModelLen: h[4]! };
}

/**
 * A spawned rank's loop: runs `forward` on each step rank 0 broadcasts, until rank 0 says stop (returns) or goes away
 * (throws the transport's DistributedBackendError).
 */
export function followSteps(tp: TensorParallel, forward: (inputs: StepInputs) => void): number {
  let steps = 0;
  for (;;) {
    const h = broadcastInts(new Int32Array(HEADER), tp);
    if (h[0] === KIND_STOP) return steps;
    if (h[0] !== KIND_STEP) throw new TensorParallelRankError(`[tensor_parallel] unexpected message kind ${h[0]} from rank 0`);
    const [, T, numSeqs, maxBlocks, hasLora] = h as unknown as [number, number, number, number, number];
    const sizes = [T, T, T, numSeqs * maxBlocks, numSeqs + 1, numSeqs, hasLora ? T : 0];
    const payload = broadcastInts(new Int32Array(sizes.reduce((a, b) => a + b, 0)), tp);
    let at = 0;
    const [ids, positions, slotMapping, blockTables, queryStart, seqLens, lora] = sizes.map((n) => payload.subarray(at, (at += n)));
    forward({ ids: ids!, positions: positions!, slotMapping: slotMapping!, blockTables: blockTables!, queryStart: queryStart!, seqLens: seqLens!, loraSlots: hasLora ? lora! : null });
    steps++;
  }
}
