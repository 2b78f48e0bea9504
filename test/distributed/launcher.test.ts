// `kiln run` (torchrun's role): the environment each rank gets, and failure handling (one rank fails -> the others are
// stopped, the launcher exits non-zero naming the rank). No gloo needed.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";
import { cleanup, fixture, runRanks } from "./run-ranks.js";

const kiln = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "bin", "kiln");

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("kiln run launcher", { timeout: 60_000 }, () => {
  it("gives each of 3 ranks torchrun's environment", async () => {
    const run = await runRanks("launch-worker", 3, ["ok"]);
    assert.equal(run.exitCode, 0);
    assert.equal(run.failedRank, null);
    const ports = new Set<string>();
    for (const [rank, res] of run.results.entries()) {
      const env = (res as { env: Record<string, string> }).env;
      assert.equal(env.RANK, String(rank));
      assert.equal(env.LOCAL_RANK, String(rank));
      assert.equal(env.WORLD_SIZE, "3");
      assert.equal(env.LOCAL_WORLD_SIZE, "3");
      assert.equal(env.GROUP_RANK, "0");
      assert.equal(env.MASTER_ADDR, "127.0.0.1");
      assert.match(env.MASTER_PORT!, /^\d+$/);
      assert.ok(Number(env.KILN_NUM_THREADS) >= 1);
      ports.add(env.MASTER_PORT!);
    }
    assert.equal(ports.size, 1, "every rank gets the same MASTER_PORT");
    cleanup(run);
  });

  it("a failing rank stops its siblings and the launcher reports it", async () => {
    const start = Date.now();
    const run = await runRanks("launch-worker", 3, ["fail"]);
    assert.equal(run.exitCode, 3);
    assert.equal(run.failedRank, 1);
    assert.ok(Date.now() - start < 20_000, "siblings sleeping 60 s were stopped");
    assert.match(run.log.join("\n"), /kiln run: rank 1 \(local rank 1\) exited with code 3; stopped the other ranks/);
    for (const res of run.results) assert.equal(alive((res as { pid: number }).pid), false);
    cleanup(run);
  });

  it("a rank that ignores SIGTERM is killed after the grace period", async () => {
    const start = Date.now();
    const run = await runRanks("launch-worker", 3, ["stubborn"], { stopGraceSeconds: 1 });
    assert.equal(run.exitCode, 3);
    assert.equal(run.failedRank, 1);
    assert.ok(Date.now() - start >= 1000, "rank 0 outlived SIGTERM until the SIGKILL");
    for (const res of run.results) assert.equal(alive((res as { pid: number }).pid), false);
    cleanup(run);
  });

  it("through the CLI: exit status and message of the failed rank; usage errors", () => {
    const out = mkdtempSync(join(tmpdir(), "kiln-dist-cli-"));
    const r = spawnSync(process.execPath, [kiln, "run", "--nproc-per-node", "2", "--stop-grace", "1", fixture("launch-worker"), out, "fail"], { encoding: "utf8", timeout: 30_000 });
    assert.equal(r.status, 3, r.stderr);
    assert.match(r.stderr, /kiln run: rank 1 \(local rank 1\) exited with code 3; stopped the other ranks/);
    const rank0 = JSON.parse(readFileSync(join(out, "rank0.json"), "utf8")) as { pid: number };
    assert.equal(alive(rank0.pid), false);
    rmSync(out, { recursive: true, force: true });
    const bad = spawnSync(process.execPath, [kiln, "run", "--nproc-per-node", "0", fixture("launch-worker")], { encoding: "utf8", timeout: 30_000 });
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /--nproc-per-node must be an integer >= 1, got "0"/);
    // a grace that is not a number would SIGKILL the other ranks at once (setTimeout(NaN) fires after 1 ms)
    for (const grace of ["soon", "-1"]) {
      const badGrace = spawnSync(process.execPath, [kiln, "run", "--nproc-per-node", "1", "--stop-grace", grace, fixture("launch-worker")], { encoding: "utf8", timeout: 30_000 });
      assert.equal(badGrace.status, 2, badGrace.stderr);
      assert.match(badGrace.stderr, new RegExp(`--stop-grace must be a number of seconds >= 0, got "${grace}"`));
    }
    const missing = spawnSync(process.execPath, [kiln, "run", "--nproc-per-node", "2", join(out, "no-such-script.js")], { encoding: "utf8", timeout: 30_000 });
    assert.equal(missing.status, 2, missing.stderr);
    assert.match(missing.stderr, /kiln run: the script ".*no-such-script\.js" does not exist/);
  });

  it("Ctrl-C (SIGINT) to the launcher stops every rank and exits 130, naming the interrupt rather than a rank", async () => {
    const out = mkdtempSync(join(tmpdir(), "kiln-dist-int-"));
    const child = spawn(process.execPath, [kiln, "run", "--nproc-per-node", "2", fixture("launch-worker"), out, "sleep"], { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    const deadline = Date.now() + 20_000;
    while (![0, 1].every((r) => existsSync(join(out, `rank${r}.json`))) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    child.kill("SIGINT");
    assert.equal(await exited, 130, stderr);
    assert.match(stderr, /kiln run: interrupted by SIGINT; the ranks were stopped/);
    assert.doesNotMatch(stderr, /rank \d+ .*killed/);
    for (const r of [0, 1]) assert.equal(alive((JSON.parse(readFileSync(join(out, `rank${r}.json`), "utf8")) as { pid: number }).pid), false);
    rmSync(out, { recursive: true, force: true });
  });

  it("Ctrl-C: ranks that ignore SIGINT are killed after --stop-grace, as torchrun's (the launcher used to wait forever)", async () => {
    const out = mkdtempSync(join(tmpdir(), "kiln-dist-deaf-"));
    const child = spawn(process.execPath, [kiln, "run", "--nproc-per-node", "2", "--stop-grace", "0.5", fixture("launch-worker"), out, "deaf"], { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    const deadline = Date.now() + 20_000;
    while (![0, 1].every((r) => existsSync(join(out, `rank${r}.json`))) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    await new Promise((r) => setTimeout(r, 300)); // the ranks' SIGINT handlers are installed right after their files
    child.kill("SIGINT");
    const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
    assert.equal(await exited, 130, `the launcher did not exit after Ctrl-C: ${stderr}`);
    clearTimeout(timer);
    for (const r of [0, 1]) assert.equal(alive((JSON.parse(readFileSync(join(out, `rank${r}.json`), "utf8")) as { pid: number }).pid), false);
    rmSync(out, { recursive: true, force: true });
  });
});
