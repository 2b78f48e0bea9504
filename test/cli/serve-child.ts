// `kiln serve` over the fake engine (serve-fixture.ts) in a child process, up once it prints where it serves.
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root

export interface ServeChild {
  child: ChildProcess;
  /** http://host:port, from the "Kiln serving ... at" line. */
  url: string;
  /** The child's stderr so far. */
  stderr(): string;
  /** The child's stdout so far. */
  stdout(): string;
}

/** Spawns serve-fixture.js with `serve ...args` and waits until it listens; rejects if it exits first. */
export async function spawnServe(args: string[]): Promise<ServeChild> {
  const child = spawn(process.execPath, [`${root}/dist/test/cli/serve-fixture.js`, "serve", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout.on("data", (d) => {
      stdout += d;
      const m = /Kiln serving \S+ at (http:\/\/\S+)\/v1/.exec(stdout);
      if (m) resolve(m[1]!);
    });
    child.on("exit", () => reject(new Error(`exited early: ${stderr}`)));
  });
  return { child, url, stderr: () => stderr, stdout: () => stdout };
}
