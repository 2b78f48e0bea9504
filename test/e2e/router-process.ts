// A real `kiln router` child process in front of worker URLs, for end-to-end tests through the `openai` client.
import { spawn, type ChildProcessByStdio } from "node:child_process";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/e2e -> package root
const live = new Set<ChildProcessByStdio<null, Readable, Readable>>();
process.on("exit", () => live.forEach((c) => c.kill("SIGKILL"))); // never leave a router behind a failed test file

export interface KilnRouter {
  /** e.g. http://127.0.0.1:41234 (no /v1). */
  url: string;
  log(): string;
  exited: Promise<number | null>;
  client(): OpenAI;
  /** SIGTERM, then the exit code (SIGKILL after 15 s). */
  stop(): Promise<number | null>;
}

/** Starts `bin/kiln router --worker-urls ...urls --port 0 ...extraArgs` and waits for its banner. */
export async function startRouter(urls: string[], extraArgs: string[] = []): Promise<KilnRouter> {
  const child = spawn(process.execPath, [`${root}/bin/kiln`, "router", "--worker-urls", ...urls, "--port", "0", ...extraArgs], { stdio: ["ignore", "pipe", "pipe"] });
  live.add(child);
  let output = "";
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => { live.delete(child); resolve(code); }));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`kiln router did not start within 20 s:\n${output}`)), 20_000);
    const onData = (d: Buffer): void => {
      output += d.toString();
      const m = /Kiln router at (http:\/\/\S+)\/v1/.exec(output);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    void exited.then((code) => { clearTimeout(timer); reject(new Error(`kiln router exited early (${code}):\n${output}`)); });
  });
  return {
    url,
    log: () => output,
    exited,
    client: () => new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 }),
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      const kill = setTimeout(() => child.kill("SIGKILL"), 15_000);
      const code = await exited;
      clearTimeout(kill);
      return code;
    },
  };
}
