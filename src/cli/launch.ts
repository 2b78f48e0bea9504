// `kiln run` (torchrun's role): spawns --nproc-per-node copies of a Node script with torch's launcher environment
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT). When one exits with an
// error, the launcher stops its siblings (SIGTERM, then SIGKILL after a grace period) and exits non-zero, naming
// the rank; as torchrun, it returns once every local process has ended.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { constants as osConstants, cpus } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Command } from "commander";
import { CliUsageError } from "./serve-args.js";

export interface LaunchOptions {
  nprocPerNode: number;
  nnodes: number;
  nodeRank: number;
  masterAddr: string;
  /** null: a free port (single-node runs only, torchrun --standalone's behaviour). */
  masterPort: number | null;
  script: string;
  args: string[];
  /** Seconds between SIGTERM and SIGKILL when stopping the other ranks. */
  stopGraceSeconds: number;
  /** Where the launcher reports (default stderr). */
  log?: (line: string) => void;
}

export interface LaunchResult {
  exitCode: number;
  /** The global rank whose failure stopped the job, or null when every rank succeeded. */
  failedRank: number | null;
}

/** A free TCP port on addr (closed again at once: the master's store binds it moments later). */
async function freePort(addr: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, addr, () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

/** `kiln` as a script means this package's own CLI (kiln run --nproc-per-node 2 kiln train --config r.toml). */
function resolveScript(script: string): string {
  if (script === "kiln" && !existsSync(script)) return join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "bin", "kiln");
  return script;
}

export async function launch(opts: LaunchOptions): Promise<LaunchResult> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const worldSize = opts.nnodes * opts.nprocPerNode;
  const port = opts.masterPort ?? (await freePort(opts.masterAddr));
  const script = resolveScript(opts.script);
  if (!existsSync(script)) throw new CliUsageError(`kiln run: the script ${JSON.stringify(opts.script)} does not exist`);
  // one native thread pool per process: share the cores instead of oversubscribing them (torchrun sets OMP_NUM_THREADS=1)
  const threads = String(Math.max(1, Math.floor(cpus().length / opts.nprocPerNode)));
  const children: ChildProcess[] = [];
  const exited = new Set<number>();
  let failed: { rank: number; code: number; how: string } | null = null;
  let killTimer: NodeJS.Timeout | null = null;

  /** Sends sig to the ranks still running, and SIGKILL to those still running stopGraceSeconds after the first call. */
  const stopRanks = (sig: NodeJS.Signals): void => {
    for (const [i, c] of children.entries()) if (!exited.has(i)) c.kill(sig);
    if (killTimer !== null) return;
    killTimer = setTimeout(() => {
      for (const [i, c] of children.entries()) if (!exited.has(i)) c.kill("SIGKILL");
    }, opts.stopGraceSeconds * 1000);
    killTimer.unref();
  };
  const stopOthers = (): void => stopRanks("SIGTERM");
  // Ctrl-C / SIGTERM to the launcher: passed to every rank (a rank that outlives it by the grace period is killed, as
  // torchrun's); the ranks' exits are then not failures of their own
  let interrupted: NodeJS.Signals | null = null;
  const onSignal = (sig: NodeJS.Signals): void => {
    interrupted ??= sig;
    stopRanks(sig);
  };
  process.on("SIGINT", onSignal).on("SIGTERM", onSignal);

  const done = new Promise<void>((resolve) => {
    for (let local = 0; local < opts.nprocPerNode; local++) {
      const rank = opts.nodeRank * opts.nprocPerNode + local;
      const child = spawn(process.execPath, [script, ...opts.args], {
        stdio: "inherit",
        env: {
          ...process.env,
          RANK: String(rank),
          LOCAL_RANK: String(local),
          WORLD_SIZE: String(worldSize),
          LOCAL_WORLD_SIZE: String(opts.nprocPerNode),
          GROUP_RANK: String(opts.nodeRank),
          MASTER_ADDR: opts.masterAddr,
          MASTER_PORT: String(port),
          KILN_NUM_THREADS: process.env.KILN_NUM_THREADS ?? threads,
        },
      });
      children.push(child);
      child.on("exit", (code, signal) => {
        exited.add(local);
        const bad = code !== 0;
        if (bad && failed === null && interrupted === null) {
          failed = { rank, code: code ?? 1, how: signal !== null ? `was killed by ${signal}` : `exited with code ${code}` };
          stopOthers();
        }
        if (exited.size === children.length) resolve();
      });
      child.on("error", (err) => {
        // spawn failure: no exit event follows
        if (exited.has(local)) return;
        exited.add(local);
        if (failed === null) {
          failed = { rank, code: 1, how: `could not start (${err.message})` };
          stopOthers();
        }
        if (exited.size === children.length) resolve();
      });
    }
  });
  await done;
  process.off("SIGINT", onSignal).off("SIGTERM", onSignal);
  if (killTimer !== null) clearTimeout(killTimer);
  const f = failed as { rank: number; code: number; how: string } | null;
  const sig = interrupted as NodeJS.Signals | null;
  if (f === null && sig !== null) {
    log(`kiln run: interrupted by ${sig}; the ranks were stopped`);
    return { exitCode: 128 + (osConstants.signals[sig] ?? 2), failedRank: null }; // as a shell reports a signal
  }
  if (f === null) return { exitCode: 0, failedRank: null };
  log(`kiln run: rank ${f.rank} (local rank ${f.rank - opts.nodeRank * opts.nprocPerNode}) ${f.how}; stopped the other ranks`);
  return { exitCode: f.code > 0 && f.code < 256 ? f.code : 1, failedRank: f.rank };
}

function intFlag(value: string, flag: string, min: number): number {
  const n = Number(value);
  if (value.trim() === "" || !Number.isInteger(n) || n < min) throw new CliUsageError(`${flag} must be an integer >= ${min}, got ${JSON.stringify(value)}`);
  return n;
}

function graceFlag(value: string): number {
  const n = Number(value);
  // Node's timers take at most 2^31 - 1 ms; NaN or a longer delay would fire at once
  if (value.trim() === "" || !Number.isFinite(n) || n < 0 || n * 1000 > 2 ** 31 - 1)
    throw new CliUsageError(`--stop-grace must be a number of seconds >= 0, got ${JSON.stringify(value)}`);
  return n;
}

export function registerRunCommand(program: Command): void {
  program.enablePositionalOptions(); // options after the script belong to the script
  program
    .command("run")
    .description("launch a distributed job: N processes of a Node script with RANK/WORLD_SIZE/MASTER_* set (torchrun's role)")
    .requiredOption("--nproc-per-node <n>", "processes on this node")
    .option("--nnodes <n>", "number of nodes", "1")
    .option("--node-rank <n>", "this node's rank", "0")
    .option("--master-addr <addr>", "address of rank 0's node (hosts the rendezvous store)", "127.0.0.1")
    .option("--master-port <port>", "port of the rendezvous store (default: a free port on one node, 29500 on several)")
    .option("--stop-grace <seconds>", "seconds between SIGTERM (or Ctrl-C's SIGINT) and SIGKILL when stopping the ranks after a failure or an interrupt", "5")
    .argument("<script>", "the Node script to run (or `kiln` for this CLI, e.g. kiln run --nproc-per-node 2 kiln train --config r.toml)")
    .argument("[args...]", "arguments of the script")
    .passThroughOptions()
    .action(async (script: string, args: string[], o: Record<string, string | undefined>) => {
      const nnodes = intFlag(o.nnodes!, "--nnodes", 1);
      const nodeRank = intFlag(o.nodeRank!, "--node-rank", 0);
      if (nodeRank >= nnodes) throw new CliUsageError(`--node-rank ${nodeRank} must be below --nnodes ${nnodes}`);
      const masterPort = o.masterPort === undefined ? (nnodes > 1 ? 29500 : null) : intFlag(o.masterPort, "--master-port", 1);
      if (masterPort !== null && masterPort > 65535) throw new CliUsageError(`--master-port must be at most 65535, got ${masterPort}`);
      const result = await launch({
        nprocPerNode: intFlag(o.nprocPerNode!, "--nproc-per-node", 1),
        nnodes,
        nodeRank,
        masterAddr: o.masterAddr!,
        masterPort,
        script,
        args,
        stopGraceSeconds: graceFlag(o.stopGrace!),
      });
      if (result.exitCode !== 0) process.exitCode = result.exitCode;
    });
}
