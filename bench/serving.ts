// Serving bench per weight format (f32, bf16, int8, int4, mxfp4) on random Llama models of real shapes: prefill tokens/s
// (one 512-token prompt), single-stream decode tokens/s, and aggregate decode tokens/s with 8 and 32 concurrent
// requests. Decode is timed apart from prefill: each run is repeated with max_tokens = 1, and decode time is the
// difference (so it starts when every request has prefilled). Next to each figure: the bandwidth roofline
// (read bandwidth probed on either side of each single-stream run / weight bytes read per decode step; see
// singleStreamRounds: Kiln's and llama.cpp's single-stream runs alternate, each bracketed by probes; the probe reads
// Kiln's loaded weights themselves, where they lie, and a 256 MiB buffer of its own is probed once per format
// for comparison) and llama.cpp (node-llama-cpp, CPU)
// on a GGUF export of the same weights (f32 -> F32, bf16 -> BF16, int8 -> Q8_0, int4 -> Q4_0, mxfp4 -> MXFP4). The
// int4, mxfp4 and int8 rows are one file for both engines: Kiln loads the Q4_0 / MXFP4 / Q8_0 export straight into
// its int4 / mxfp4 / int8_g32 kernels
// (no dequantization; token_embd's blocks serve the tied LM head too), so both run bit-identical weights. With an
// addon that lacks int8_g32, Kiln's int8 row falls back to per-row int8 (--quantization int8; close, not identical).
// --formats q4_k adds a Q4_K export, likewise one file for both (Kiln's q4_k kernel); matrices whose in_features is
// not a multiple of 256 (most of SmolLM's: 576) are written as Q4_0 and run as int4. --formats q5_k / q6_k: a Q5_K /
// Q6_K export (Kiln's q5_k / q6_k kernel), with those matrices written as Q8_0 (int8_g32); q4_k_m: llama.cpp's
// Q4_K_M mix (Q4_K, Q6_K output and some attn_v / ffn_down: exportGguf), the most common GGUF layout. --formats
// iq4_nl: an IQ4_NL export (Kiln's iq4_nl kernel; Kiln's own encoder, not llama.cpp's scale search).
// Usage: npm run bench [-- --model smollm|1b] [--models smollm,1b] [--formats f32,bf16,int8,int4,q4_k,q4_k_m,q5_k,q6_k,iq4_nl,mxfp4] [--conc 8,32]
//                      [--decode 32] [--prefill 512] [--rounds 5] [--no-llama-cpp] [--no-accuracy] [--threads 2]
import * as os from "node:os";
import * as path from "node:path";
import { tryLoadNativeKernels } from "../src/backends/cpu/native.js";
import { nativeTakesScheme } from "../src/backends/cpu/quant-reference.js";
import { LLM } from "../src/engine/llm-engine.js";
import { createServingSetupSync } from "../src/engine/serving.js";
import type { GgufExportType } from "../src/models/init-model.js";
import { BENCH_MODELS, benchGguf, benchModelDir, decodeBytes, decodeReads, TOKENIZER_VOCAB } from "./bench-models.js";
import { bandwidthProbe } from "./timing.js";

const DECODE_PROMPT_LEN = 16;

function option(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : fallback;
}
const flag = (name: string) => process.argv.includes(name);
const PREFILL_LEN = Number(option("--prefill", "512")); // one prompt of this many tokens (small for smoke runs)

type Format = "f32" | "bf16" | "int8" | "int4" | "q4_k" | "q4_k_m" | "q5_k" | "q6_k" | "iq4_nl" | "mxfp4";
const GGUF_PAIR: Record<Format, GgufExportType> = {
  f32: "F32", bf16: "BF16", int8: "Q8_0", int4: "Q4_0", q4_k: "Q4_K", q4_k_m: "Q4_K_M", q5_k: "Q5_K", q6_k: "Q6_K", iq4_nl: "IQ4_NL", mxfp4: "MXFP4",
};

function prompts(n: number, len: number, seed: number): number[][] {
  let s = seed >>> 0;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  return Array.from({ length: n }, () => Array.from({ length: len }, () => 3 + Math.floor(next() * (TOKENIZER_VOCAB - 3))));
}

function best<T>(runs: number, f: () => T, key: (t: T) => number): T {
  let out = f();
  for (let i = 1; i < runs; i++) {
    const r = f();
    if (key(r) < key(out)) out = r;
  }
  return out;
}

/** Kiln's runs on one loaded engine: prefill seconds of the 512-token prompt, decode tokens/s at a concurrency. */
function kilnRuns(llm: LLM, decodeTokens: number) {
  const gen = (ps: number[][], maxTokens: number) => {
    const t0 = performance.now();
    llm.generate(ps.map((promptTokenIds) => ({ promptTokenIds })), { temperature: 0, maxTokens, ignoreEos: true });
    return (performance.now() - t0) / 1000;
  };
  gen(prompts(2, 32, 1), 4); // warm-up
  let prefillWarm = false;
  return {
    prefill: () => {
      // one untimed run of the same prompt first, as llama.cpp's side gets (openLlamaCpp): the first 512-token
      // step grows buffers and faults in fresh pages that later ones reuse
      if (!prefillWarm) gen(prompts(1, PREFILL_LEN, 7), 1);
      prefillWarm = true;
      return PREFILL_LEN / best(2, () => gen(prompts(1, PREFILL_LEN, 7), 1), (s) => s);
    },
    /** decode only: the same requests run to 1 token and to 1 + decodeTokens, the difference timed */
    decode: (c: number) => {
      const ps = prompts(c, DECODE_PROMPT_LEN, 100 + c);
      const t1 = best(2, () => gen(ps, 1), (s) => s);
      const tn = best(2, () => gen(ps, 1 + decodeTokens), (s) => s);
      return (c * decodeTokens) / Math.max(1e-9, tn - t1);
    },
  };
}

/** node-llama-cpp's branded token ids. */
const tokens = (ids: number[]) => ids as unknown as import("node-llama-cpp").Token[];

interface EngineRuns {
  prefill(): number | Promise<number>;
  decode(c: number): number | Promise<number>;
}

/** llama.cpp (node-llama-cpp, CPU) on a GGUF, as EngineRuns; a string when it cannot run. */
async function openLlamaCpp(gguf: string, concs: number[], decodeTokens: number, threads: number): Promise<(EngineRuns & { close(): Promise<void> }) | string> {
  let mod: typeof import("node-llama-cpp");
  try {
    mod = await import("node-llama-cpp");
  } catch {
    return "node-llama-cpp not installed";
  }
  const llama = await mod.getLlama({ gpu: false, build: "never", logLevel: "error" as never });
  const model = await llama.loadModel({ modelPath: gguf });
  const maxC = Math.max(1, ...concs);
  let ctx: Awaited<ReturnType<typeof model.createContext>>;
  try {
    ctx = await model.createContext({ contextSize: Math.max(1024, maxC * (DECODE_PROMPT_LEN + decodeTokens + 8)), sequences: maxC, batchSize: 512, threads });
  } catch (e) {
    await model.dispose();
    throw e;
  }
  const seqs = Array.from({ length: maxC }, () => ctx.getSequence());
  const prefillOnce = async () => {
    await seqs[0]!.clearHistory();
    const t0 = performance.now();
    await seqs[0]!.evaluateWithoutGeneratingNewTokens(tokens(prompts(1, PREFILL_LEN, 7)[0]!));
    return (performance.now() - t0) / 1000;
  };
  const decodeOnce = async (c: number) => {
    const ps = prompts(c, DECODE_PROMPT_LEN, 100 + c);
    await Promise.all(seqs.slice(0, c).map(async (s) => s.clearHistory()));
    // prefill every sequence (all but the last prompt token), then time the concurrent decode
    await Promise.all(seqs.slice(0, c).map((s, i) => s.evaluateWithoutGeneratingNewTokens(tokens(ps[i]!.slice(0, -1)))));
    const t0 = performance.now();
    await Promise.all(
      seqs.slice(0, c).map(async (s, i) => {
        let n = 0;
        for await (const _ of s.evaluate(tokens([ps[i]!.at(-1)!]), { temperature: 0 })) if (++n >= decodeTokens) break;
      }),
    );
    return (performance.now() - t0) / 1000;
  };
  const close = async () => {
    await ctx.dispose();
    await model.dispose();
  };
  try {
    await prefillOnce(); // warm-up
  } catch (e) {
    await close();
    throw e;
  }
  return {
    prefill: async () => PREFILL_LEN / Math.min(await prefillOnce(), await prefillOnce()),
    decode: async (c: number) => (c * decodeTokens) / Math.min(await decodeOnce(c), await decodeOnce(c)),
    close,
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
/** Probes on either side of a single-stream run within this ratio: the bandwidth held steady during the run. */
const STEADY_PROBES = 1.15;
/** A round trip under this many ns: the two vCPUs sat close (~70 ns; ~300 ns apart, native/thread-pool.h). */
const CLOSE_NS = 150;

/**
 * Single-stream decode against the roofline, in pairs: this VM's read bandwidth jumps between ~35 and ~60 GB/s
 * within seconds (measured: 37.8 then 58.7 GB/s on two probes under a second apart; other tenants, presumably), so a
 * roofline from probes taken at other moments than the decode it divides says more
 * about the moment than the engine. Each of `reps` rounds probes the bandwidth, runs Kiln's decode, probes, runs
 * llama.cpp's, probes; each run's roofline fraction uses the mean of the probes on either side of it, and the
 * engines' ratio is taken within the round. Medians over the rounds are reported, with the best of each; Kiln's
 * roofline median leaves out rounds whose two probes differ by more than STEADY_PROBES (the bandwidth moved during
 * the run, e.g. 26.8 then 69.8 GB/s around one 1B run, whose fraction read 105%), and every round is listed.
 * Next to each of Kiln's probes, `hop` (when the addon has it) times a cache line's round trip between the two
 * threads: ~70 ns where this VM's vCPUs sit close (and the probes read ~35 GB/s), ~300 ns where they sit apart (and
 * the probes read 55-60 GB/s, but each hand-off within a decode step costs more; native/thread-pool.h).
 */
async function singleStreamRounds(
  kiln: EngineRuns, lc: EngineRuns | null, probe: () => number, bytes: number, reps: number, hop?: () => number,
) {
  const rounds: { kiln: number; kilnRoof: number; bw: [number, number]; ns?: [number, number]; lc?: number; lcRoof?: number }[] = [];
  const probes: number[] = [];
  const probed = () => {
    probes.push(probe());
    return probes.at(-1)!;
  };
  for (let r = 0; r < reps; r++) {
    const bw0 = probed();
    const ns0 = hop?.();
    const k = await kiln.decode(1);
    const bw1 = probed();
    const ns1 = hop?.();
    const round: (typeof rounds)[number] = { kiln: k, kilnRoof: (((bw0 + bw1) / 2) * 1e9) / bytes, bw: [bw0, bw1] };
    if (ns0 !== undefined && ns1 !== undefined) round.ns = [ns0, ns1];
    if (lc) {
      round.lc = await lc.decode(1);
      round.lcRoof = (((bw1 + probed()) / 2) * 1e9) / bytes;
    }
    rounds.push(round);
  }
  const withLc = rounds.filter((r) => r.lc !== undefined);
  // A round whose two probes disagree saw the bandwidth change during the run: its roofline is a guess, so the
  // median leaves it out (unless every round is such a round). Every round is listed.
  const steady = rounds.filter((r) => Math.max(...r.bw) / Math.min(...r.bw) <= STEADY_PROBES);
  // The steady rounds by where the vCPUs sat (both round trips under CLOSE_NS, or not; a round with a round trip
  // unknown, -1, in neither): reported next to the median, which stays over all steady rounds.
  const placed = (close: boolean) =>
    steady.filter((r) => r.ns !== undefined && r.ns.every((v) => v >= 0) && r.ns.every((v) => v < CLOSE_NS) === close);
  const byPlacement = (rs: typeof rounds) =>
    ({ fraction: rs.length ? median(rs.map((r) => r.kiln / r.kilnRoof)) : undefined, rounds: rs.length });
  return {
    close: byPlacement(placed(true)),
    apart: byPlacement(placed(false)),
    best: Math.max(...rounds.map((r) => r.kiln)),
    roofFraction: median((steady.length > 0 ? steady : rounds).map((r) => r.kiln / r.kilnRoof)),
    steadyRounds: steady.length,
    perRound: rounds.map((r) => {
      const ns = (v: number) => (v < 0 ? "?" : v.toFixed(0)); // -1: no answer within 100 ms
      const hops = r.ns ? ` (${ns(r.ns[0])}/${ns(r.ns[1])} ns)` : "";
      return `${r.bw[0].toFixed(0)}/${r.bw[1].toFixed(0)}${hops}: ${((100 * r.kiln) / r.kilnRoof).toFixed(0)}%`;
    }),
    probeRange: [Math.min(...probes), Math.max(...probes)], // GB/s, every probe of the rounds
    lcBest: withLc.length ? Math.max(...withLc.map((r) => r.lc!)) : undefined,
    lcRoofFraction: withLc.length ? median(withLc.map((r) => r.lc! / r.lcRoof!)) : undefined,
    ratio: withLc.length ? median(withLc.map((r) => r.kiln / r.lc!)) : undefined,
  };
}

/** f32's greedy continuations of fixed prompts, and at every position the log-probability f32 gives its token. */
interface F32Reference {
  prefixes: number[][];
  want: { token: number; lp: number | undefined }[];
}
function f32Reference(f32: LLM, n = 4, len = 24): F32Reference {
  const ps = prompts(n, 32, 4242);
  const ref = f32.generate(ps.map((promptTokenIds) => ({ promptTokenIds })), { temperature: 0, maxTokens: len, ignoreEos: true });
  const prefixes: number[][] = [];
  const tokens: number[] = [];
  ref.forEach((o, i) => {
    const ids = o.outputs[0]!.tokenIds;
    ids.forEach((t, j) => {
      prefixes.push([...ps[i]!, ...ids.slice(0, j)]);
      tokens.push(t);
    });
  });
  const refLp = f32.generate(prefixes.map((promptTokenIds) => ({ promptTokenIds })), { temperature: 0, maxTokens: 1, logprobs: 20 });
  return { prefixes, want: tokens.map((token, i) => ({ token, lp: refLp[i]!.outputs[0]!.logprobs?.[0]?.get(token)?.logprob })) };
}

/**
 * Accuracy vs f32 on the same weights: teacher-forced greedy agreement (at each position of f32's greedy
 * continuation, does the quantized model pick the same next token?) and the error of the log-probability it gives
 * f32's token (|logprob_q - logprob_f32|, logits minus logsumexp) over the positions where it is in its top 20.
 * The f32 reference is computed once, so the f32 model need not stay resident (a 1B f32 model is 5 GB).
 */
function accuracy(ref: F32Reference, q: LLM): { agree: number; meanLp: number; maxLp: number } {
  const got = q.generate(ref.prefixes.map((promptTokenIds) => ({ promptTokenIds })), { temperature: 0, maxTokens: 1, logprobs: 20 });
  let agree = 0, sum = 0, count = 0, max = 0;
  got.forEach((o, i) => {
    const w = ref.want[i]!;
    if (o.outputs[0]!.tokenIds[0] === w.token) agree++;
    const b = o.outputs[0]!.logprobs?.[0]?.get(w.token)?.logprob;
    if (w.lp === undefined || b === undefined) return;
    const e = Math.abs(w.lp - b);
    sum += e;
    count++;
    max = Math.max(max, e);
  });
  return { agree: agree / ref.want.length, meanLp: count ? sum / count : NaN, maxLp: max };
}

async function main(): Promise<void> {
  const models = option("--models", option("--model", "smollm")).split(",");
  const formats = option("--formats", "f32,bf16,int8,int4,mxfp4").split(",") as Format[];
  const concs = option("--conc", "8,32").split(",").map(Number);
  const decodeTokens = Number(option("--decode", "32"));
  const threads = Number(option("--threads", String(Math.min(2, os.cpus().length))));
  const native = tryLoadNativeKernels();
  if (!native) throw new Error("bench/serving needs the native addon (npm run build)");
  native.setNumThreads(threads);
  const probe = bandwidthProbe(native);
  const quickBandwidth = () => native.memoryReadBandwidth(probe, 2, threads);
  const rounds = Number(option("--rounds", "5"));
  if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be an integer >= 1, got ${option("--rounds", "5")}`);
  const dt = native.decodeTuning?.();
  const tuningText = dt
    ? `; decode tiles prefetch ${dt.quantAhead} (quantized) / ${dt.gemvAhead} (f32, bf16) bytes ahead into ${dt.prefetchIntoL1 ? "L1" : "L2"}, shares balanced while they run in products of ${dt.handOverMinBytes} bytes or more`
    : "";
  console.log(`cpu native ${native.isa} (quant ${native.quantIsa}), ${threads} threads; read bandwidth ${quickBandwidth().toFixed(1)} GB/s at start${tuningText}`);
  console.log(`prefill: one ${PREFILL_LEN}-token prompt; decode: ${decodeTokens} tokens after ${DECODE_PROMPT_LEN}-token prompts, prefill excluded; greedy`);

  for (const key of models) {
    const preset = BENCH_MODELS[key] ?? key;
    const lines: string[] = [];
    const quantized = (f: Format) => f === "int8" || f === "int4" || f === "q4_k" || f === "q4_k_m" || f === "q5_k" || f === "q6_k" || f === "iq4_nl" || f === "mxfp4";
    const withAccuracy = !flag("--no-accuracy") && formats.some(quantized);
    let reference: F32Reference | null = null;
    const engineOptions = { maxModelLen: 1024, maxNumSeqs: 128, enablePrefixCaching: false, kvCacheMemory: 512 * 2 ** 20 };
    for (const format of formats) {
      (globalThis as { gc?: () => void }).gc?.(); // with node --expose-gc: free the previous format's model now
      const dir = benchModelDir(format === "bf16" ? "bfloat16" : "float32", preset);
      const maxC = Math.max(1, ...concs);
      // without an f32 row first, the reference comes from a transient f32 model (dropped before this one loads)
      if (withAccuracy && !reference && quantized(format)) reference = f32Reference(new LLM({ model: benchModelDir("float32", preset), ...engineOptions }));
      // int4 / q4_k / q6_k / mxfp4 / int8: the Q4_0 / Q4_K / Q6_K / MXFP4 / Q8_0 GGUF llama.cpp reads (linears and
      // the tied head stay quantized, as loaded)
      const sameFile = format === "int4" || format === "q4_k" || format === "q4_k_m" || format === "q5_k" || format === "q6_k" || format === "iq4_nl" || format === "mxfp4" || (format === "int8" && nativeTakesScheme(native, "int8_g32"));
      const model = sameFile ? benchGguf(benchModelDir("float32", preset), GGUF_PAIR[format]) : dir;
      const setup = createServingSetupSync({
        model, quantization: format === "int8" && !sameFile ? format : null, maxModelLen: 1024, maxNumSeqs: maxC,
        maxNumBatchedTokens: 1024, enablePrefixCaching: false, kvCacheMemory: 512 * 2 ** 20,
      });
      const llm = new LLM({ runner: setup.runner, tokenizer: setup.loaded.tokenizer, engineArgs: setup.engineArgs });
      const bytes = decodeBytes(setup.loaded.model);
      // The roofline's probe (the best of its stream variants, 2 passes each) reads the loaded weights, as one run of
      // bytes split between the threads: the bandwidth of the very memory a decode step reads. A buffer of the probe's
      // own read 42-44 GB/s where these weights read 56-58 (SmolLM-135M Q8_0, one process; native
      // memoryReadBandwidth gives a case of one buffer's pages reading slower than another's), which flattered the
      // engine by a third.
      const reads = decodeReads(setup.loaded.model);
      const weightsBandwidth = () => native.memoryReadBandwidth(reads, 2, threads);
      if (withAccuracy && !reference && format === "f32") reference = f32Reference(llm);
      if (reference && quantized(format)) {
        const a = accuracy(reference, llm);
        lines.push(`${format.padEnd(5)} accuracy vs f32: teacher-forced greedy agreement ${(100 * a.agree).toFixed(1)}%, |logprob error| of f32's token mean ${a.meanLp.toFixed(4)} max ${a.maxLp.toFixed(4)}`);
        console.log(lines.at(-1));
      }
      const kilnWeights = sameFile ? `${setup.loaded.quantization} from the ${GGUF_PAIR[format]} file` : (setup.loaded.quantization ?? format);
      const pair = GGUF_PAIR[format];
      // both engines stay loaded for this format, so their single-stream runs can alternate (singleStreamRounds)
      const lc = flag("--no-llama-cpp") ? "skipped (--no-llama-cpp)" : await openLlamaCpp(benchGguf(benchModelDir(format === "bf16" ? "bfloat16" : "float32", preset), pair), concs, decodeTokens, threads);
      const lcr = typeof lc === "string" ? null : lc;
      const kiln = kilnRuns(llm, decodeTokens);
      const batched = new Map<number, { kiln: number; lc?: number }>();
      let x1: Awaited<ReturnType<typeof singleStreamRounds>>, prefill: number, lcPrefill: number | undefined, ownProbe: number;
      try {
        const hop = native.coreRoundTrip ? () => native.coreRoundTrip!(20000) : undefined;
        x1 = await singleStreamRounds(kiln, lcr, weightsBandwidth, bytes, rounds, hop);
        ownProbe = quickBandwidth();
        prefill = kiln.prefill();
        lcPrefill = lcr ? await lcr.prefill() : undefined;
        for (const c of concs.filter((c) => c !== 1)) batched.set(c, { kiln: kiln.decode(c), lc: lcr ? await lcr.decode(c) : undefined });
      } finally {
        await lcr?.close();
      }
      const roofAt = (gbs: number) => (gbs * 1e9) / bytes;
      const ratio = (a: number, b: number | undefined) => (b ? `${(a / b).toFixed(2)}x` : "-");
      const pct = (f: number | undefined) => (f === undefined ? "-" : `${(100 * f).toFixed(0)}%`);
      const byPlace = (p: { fraction?: number; rounds: number }) => (p.rounds ? `${pct(p.fraction)} (median of ${p.rounds})` : "no round");
      const [lo, hi] = x1.probeRange;
      lines.push(
        `${format.padEnd(5)} ${(bytes / 2 ** 20).toFixed(0).padStart(6)} MiB (kiln ${kilnWeights}) | prefill ${prefill.toFixed(0).padStart(6)} tok/s (llama.cpp ${pair} ${lcPrefill?.toFixed(0) ?? "-"}, ${ratio(prefill, lcPrefill)})`,
        `        decode x1  ${x1.best.toFixed(1).padStart(7)} tok/s best; ${pct(x1.roofFraction)} of the roofline (median of the ${x1.steadyRounds || rounds} of ${rounds} rounds ${x1.steadyRounds ? "whose probes agreed" : "(no round's probes agreed"} within ${Math.round((STEADY_PROBES - 1) * 100)}%${x1.steadyRounds ? "" : ")"}, probes ${lo!.toFixed(1)}-${hi!.toFixed(1)} GB/s = ${roofAt(lo!).toFixed(0)}-${roofAt(hi!).toFixed(0)} tok/s); llama.cpp ${x1.lcBest?.toFixed(1) ?? "-"} best, ${pct(x1.lcRoofFraction)} of the roofline; kiln/llama.cpp ${x1.ratio ? `${x1.ratio.toFixed(2)}x` : "-"} (median of rounds), ${ratio(x1.best, x1.lcBest)} best/best`,
      );
      lines.push(`        x1 rounds (GB/s probed before/after${native.coreRoundTrip ? " (the threads' round trip then)" : ""}: % of the roofline): ${x1.perRound.join(", ")}; the probe's own 256 MiB buffer read ${ownProbe.toFixed(1)} GB/s after them`);
      if (native.coreRoundTrip)
        lines.push(`        x1 steady rounds by placement (% of the roofline): vCPUs close (round trips under ${CLOSE_NS} ns) ${byPlace(x1.close)}, apart ${byPlace(x1.apart)}`);
      for (const [c, r] of batched)
        lines.push(`        decode x${String(c).padEnd(2)} ${r.kiln.toFixed(1).padStart(7)} tok/s (${(r.kiln / roofAt(hi!)).toFixed(2)}x the highest single-stream roofline); llama.cpp ${r.lc?.toFixed(1) ?? "-"} (${ratio(r.kiln, r.lc)})`);
      if (typeof lc === "string") lines.push(`        llama.cpp: ${lc}`);
      console.log(`[${preset}] ${lines.slice(-3 - batched.size - (typeof lc === "string" ? 1 : 0)).join("\n")}`);
    }
    console.log(`\n== ${preset} (${path.basename(benchModelDir("float32", preset))}) ==\n${lines.join("\n")}\n`);
  }
}

await main();
