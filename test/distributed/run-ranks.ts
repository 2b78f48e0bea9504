// Test helper: runs a fixture script under the launcher (`kiln run`'s launch()) and collects each rank's JSON.
import { mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { launch, type LaunchResult } from "../../src/cli/launch.js";
import { glooUnavailableReason } from "../../src/distributed/index.js";

/** Why distributed tests must skip here (the gloo addon is not built), or false. */
export const skipWithoutGloo: string | false = (() => {
  const reason = glooUnavailableReason();
  return reason === null ? false : `gloo back end unavailable: ${reason}`;
})();

export const fixture = (name: string): string => join(dirname(fileURLToPath(import.meta.url)), "fixtures", `${name}.js`);

export interface RanksRun extends LaunchResult {
  /** rank<r>.json of each rank that wrote one (null where it did not). */
  results: (Record<string, unknown> | null)[];
  log: string[];
  outDir: string;
}

/** Launches nproc ranks of fixtures/<name>.js with args [outDir, ...args] on masterAddr (127.0.0.1). */
export async function runRanks(
  name: string, nproc: number, args: string[] = [], opts: { stopGraceSeconds?: number; masterAddr?: string; masterPort?: number } = {},
): Promise<RanksRun> {
  const outDir = mkdtempSync(join(tmpdir(), `kiln-dist-${name}-`));
  const log: string[] = [];
  const result = await launch({
    nprocPerNode: nproc, nnodes: 1, nodeRank: 0, masterAddr: opts.masterAddr ?? "127.0.0.1", masterPort: opts.masterPort ?? null,
    script: fixture(name), args: [outDir, ...args], stopGraceSeconds: opts.stopGraceSeconds ?? 2, log: (l) => log.push(l),
  });
  const results = Array.from({ length: nproc }, (_, r) => {
    const p = join(outDir, `rank${r}.json`);
    return existsSync(p) ? (JSON.parse(readFileSync(p, "utf8")) as Record<string, unknown>) : null;
  });
  return { ...result, results, log, outDir };
}

export function cleanup(run: RanksRun): void {
  rmSync(run.outDir, { recursive: true, force: true });
}
