// Start-up bench: cold vs warm `kiln serve` start to first token. Each run spawns `bin/kiln serve` on the
// SmolLM-135M-shaped bench model with a given compile-cache directory (KILN_CACHE_DIR), waits for the URL line,
// sends one streamed completion (1 output token) and stops the server. "cold" uses an empty cache directory,
// so every fused kernel of every captured decode step is compiled by the system C compiler; "warm" starts the
// same model and config again with that directory filled, so every program loads from the cache and the step
// graphs are replayed from their recordings instead of traced. Also runs once with --enforce-eager (no step
// graphs, nothing compiled) as the floor.
// Usage: npm run bench:startup [-- --dtype float32|bfloat16] [--max-num-seqs 32] [--runs 2]
import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { benchModelDir } from "./bench-models.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

function option(name: string, def: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : def;
}

interface Run {
  label: string;
  /** Spawn -> the server prints its URL (model loaded, KV cache sized, step graphs captured). */
  readySeconds: number;
  /** Spawn -> the first streamed token arrives. */
  firstTokenSeconds: number;
  /** The step-graph phase as the server reports it (capture + compile or cache loads), and programs compiled / loaded. */
  graphSeconds: number;
  compiled: number;
  fromCache: number;
}

async function startToFirstToken(label: string, model: string, cacheDir: string, extra: string[]): Promise<Run> {
  const t0 = performance.now();
  const child = spawn(process.execPath, [path.join(root, "bin/kiln"), "serve", model, "--host", "127.0.0.1", "--port", "0", ...extra], {
    env: { ...process.env, KILN_CACHE_DIR: cacheDir },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  let log = "";
  child.stderr.on("data", (d: Buffer) => {
    stderr += d.toString();
    log += d.toString();
  });
  try {
    const url = await new Promise<string>((resolve, reject) => {
      let out = "";
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString();
        log += d.toString();
        const m = /(http:\/\/[^\s]+)/.exec(out);
        if (m) resolve(m[1]!.replace(/\/+$/, "").replace(/\/v1$/, ""));
      });
      child.on("exit", (code) => reject(new Error(`kiln serve exited with ${code}: ${stderr.slice(-2000)}`)));
    });
    const readySeconds = (performance.now() - t0) / 1000;
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", prompt: "The old man", max_tokens: 1, stream: true }),
    });
    if (!res.ok || res.body === null) throw new Error(`completion failed: ${res.status} ${await res.text()}`);
    const reader = res.body.getReader();
    let firstTokenSeconds = NaN;
    let text = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
      if (Number.isNaN(firstTokenSeconds) && text.includes('"text"')) firstTokenSeconds = (performance.now() - t0) / 1000;
    }
    const g = /(\d+) fused programs compiled \+ (\d+) from the compile cache(?:, graphs replayed from the compile cache)? in ([\d.]+) s/.exec(log);
    return { label, readySeconds, firstTokenSeconds, graphSeconds: g ? Number(g[3]) : 0, compiled: g ? Number(g[1]) : 0, fromCache: g ? Number(g[2]) : 0 };
  } finally {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    }
  }
}

async function main(): Promise<void> {
  const dtype = option("--dtype", "bfloat16") as "float32" | "bfloat16";
  const maxNumSeqs = option("--max-num-seqs", "32");
  const runs = Number(option("--runs", "2"));
  const model = benchModelDir(dtype);
  const common = ["--served-model-name", "m", "--max-num-seqs", maxNumSeqs, "--max-model-len", "512", "--kv-cache-memory", String(256 * 2 ** 20)];
  console.log(`kiln serve ${path.basename(model)} (${dtype}), --max-num-seqs ${maxNumSeqs}; ${os.cpus().length} cores; start -> first streamed token`);
  const rows: Run[] = [];
  for (let r = 0; r < runs; r++) {
    const cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-startup-cache-"));
    try {
      rows.push(await startToFirstToken(`cold #${r + 1}`, model, cacheDir, common));
      rows.push(await startToFirstToken(`warm #${r + 1}`, model, cacheDir, common));
    } finally {
      fs.rmSync(cacheDir, { recursive: true, force: true });
    }
  }
  const eagerCache = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-startup-cache-"));
  rows.push(await startToFirstToken("--enforce-eager", model, eagerCache, [...common, "--enforce-eager"]));
  fs.rmSync(eagerCache, { recursive: true, force: true });

  console.log(
    ["run".padEnd(16), "ready s".padStart(8), "first token s".padStart(14), "step graphs s".padStart(14), "compiled".padStart(9), "from cache".padStart(11)].join(" "),
  );
  for (const r of rows)
    console.log(
      [
        r.label.padEnd(16),
        r.readySeconds.toFixed(2).padStart(8),
        r.firstTokenSeconds.toFixed(2).padStart(14),
        r.graphSeconds.toFixed(2).padStart(14),
        String(r.compiled).padStart(9),
        String(r.fromCache).padStart(11),
      ].join(" "),
    );
  const mean = (p: string, f: (r: Run) => number) => {
    const xs = rows.filter((r) => r.label.startsWith(p)).map(f);
    return xs.reduce((a, b) => a + b, 0) / xs.length;
  };
  console.log(`warm / cold start-to-first-token = ${(mean("warm", (r) => r.firstTokenSeconds) / mean("cold", (r) => r.firstTokenSeconds)).toFixed(3)} (mean of ${runs} pairs)`);
  console.log(`warm / cold step-graph phase     = ${(mean("warm", (r) => r.graphSeconds) / mean("cold", (r) => r.graphSeconds)).toFixed(3)}`);
}

await main();
