// A real `kiln serve` child process on a tiny random model, for end-to-end tests through the `openai` client.
import assert from "node:assert/strict";
import { spawn, type ChildProcessByStdio } from "node:child_process";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { tinyModelDir } from "../helpers/tiny-model.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/e2e -> package root
const live = new Set<ChildProcessByStdio<null, Readable, Readable>>();
process.on("exit", () => live.forEach((c) => c.kill("SIGKILL"))); // never leave a server behind a failed test file

export interface KilnServer {
  /** e.g. http://127.0.0.1:41234 (no /v1); https:// with --ssl-certfile. */
  url: string;
  pid: number;
  /** The served model name (the model directory, as `kiln serve` names it by default). */
  model: string;
  /** Everything the process wrote to stdout and stderr so far. */
  log(): string;
  /** Resolves with the exit code once the process has exited. */
  exited: Promise<number | null>;
  client(options?: { apiKey?: string }): OpenAI;
  /** Reads one sample from /metrics: the first line of `name` whose labels contain `labels` (e.g. 'finished_reason="abort"'). */
  metric(name: string, labels?: string): Promise<number>;
  /** SIGTERM, then the exit code (SIGKILL after 15 s). */
  stop(): Promise<number | null>;
}

/**
 * Starts `bin/kiln serve <tiny Llama> --host 127.0.0.1 --port 0 ...extraArgs` and waits for its banner.
 * @example const server = await startKiln(["--max-model-len", "64"]); const models = await server.client().models.list();
 */
export async function startKiln(extraArgs: string[] = [], modelDir = tinyModelDir("LlamaForCausalLM"), env: Record<string, string> = {}): Promise<KilnServer> {
  const p = await launchKiln(["serve", modelDir, "--host", "127.0.0.1", "--port", "0", ...extraArgs], /Kiln serving \S+ at (https?:\/\/\S+)\/v1/, 30_000, env);
  return {
    ...p,
    model: modelDir,
    client: ({ apiKey = "unused" } = {}) => new OpenAI({ baseURL: `${p.url}/v1`, apiKey, maxRetries: 0, timeout: 60_000 }),
    metric: async (name, labels = "") => {
      const text = await (await fetch(`${p.url}/metrics`)).text();
      const line = text.split("\n").find((l) => (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && l.includes(labels));
      assert.ok(line, `metric ${name}{${labels}} missing from /metrics`);
      return Number(line.slice(line.lastIndexOf(" ") + 1));
    },
  };
}

/** A started `bin/kiln <command>` process: its URL (from its banner), output, exit and a SIGTERM stop. */
export interface KilnProcess {
  url: string;
  pid: number;
  log(): string;
  exited: Promise<number | null>;
  /** SIGTERM, then the exit code (SIGKILL after 15 s). */
  stop(): Promise<number | null>;
}

/**
 * Spawns `bin/kiln ...args` and waits (up to `startMs`) for the banner `banner`, whose first group is the URL; the
 * process is SIGKILLed if the test file exits first.
 */
export async function launchKiln(args: string[], banner: RegExp, startMs: number, env: Record<string, string> = {}): Promise<KilnProcess> {
  const what = `kiln ${args[0]}`;
  const child = spawn(process.execPath, [`${root}/bin/kiln`, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  live.add(child);
  let output = "";
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => { live.delete(child); resolve(code); }));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not start within ${startMs / 1000} s:\n${output}`)), startMs);
    const onData = (d: Buffer): void => {
      output += d.toString();
      const m = banner.exec(output);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    void exited.then((code) => { clearTimeout(timer); reject(new Error(`${what} exited early (${code}):\n${output}`)); });
  });
  return {
    url,
    pid: child.pid!,
    log: () => output,
    exited,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      const kill = setTimeout(() => child.kill("SIGKILL"), 15_000);
      const code = await exited;
      clearTimeout(kill);
      return code;
    },
  };
}

/** POSTs raw JSON (or a raw string) and returns status + parsed body: for requests the typed client refuses to send. */
export async function postRaw(url: string, path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

/** Asserts OpenAI's error object {error: {message, type, param, code}} with exactly those four keys. */
export function assertErrorBody(body: unknown, expect: { type: string; param?: string | null; code?: string | null; message?: RegExp }): void {
  const err = (body as { error?: Record<string, unknown> }).error;
  assert.ok(err, `expected an error object, got ${JSON.stringify(body)}`);
  assert.deepEqual(Object.keys(err).sort(), ["code", "message", "param", "type"]);
  assert.equal(typeof err.message, "string");
  assert.ok((err.message as string).length > 0);
  assert.equal(err.type, expect.type);
  if (expect.param !== undefined) assert.equal(err.param, expect.param);
  if (expect.code !== undefined) assert.equal(err.code, expect.code);
  if (expect.message) assert.match(err.message as string, expect.message);
}
