// `kiln train`, `kiln init-model` and `kiln convert`: the training and model-file commands.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { Command } from "commander";
import { GGUF_EXPORT_TYPES, PRESETS, type GgufExportType } from "../models/model-presets.js";
import { SUPPORTED_ARCHITECTURES, type Architecture } from "../models/hf-config.js";
import { CliUsageError } from "./serve-args.js";
import { DEFAULT_MODEL_DIR } from "./default-model.js";

/** This machine's FMA peak over all native threads (for MFU), or 117 GFLOP/s per core when no native probe. */
async function measurePeakFlops(): Promise<number> {
  try {
    const { getBackend } = await import("../backends/registry.js");
    const cpu = getBackend("cpu") as unknown as { native?: { fmaPeak(iterations: number): number; getNumThreads(): number } };
    if (cpu.native) return cpu.native.fmaPeak(2e7) * 1e9 * cpu.native.getNumThreads();
  } catch {
    // no native back end: fall through
  }
  return 117e9 * os.cpus().length;
}

/** key=value overrides, e.g. --set training.steps=20 */
function parseOverrides(pairs: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of pairs) {
    const eq = p.indexOf("=");
    if (eq <= 0) throw new CliUsageError(`--set expects section.key=value, got ${JSON.stringify(p)}`);
    out[p.slice(0, eq)] = p.slice(eq + 1);
  }
  return out;
}

/**
 * An init-model --set value as config.json holds it: JSON where it parses (numbers, true/false, null, and objects or
 * lists such as rope_scaling), else the text itself (e.g. hidden_act=silu). An empty value is refused.
 */
export function configValue(key: string, text: string): unknown {
  if (text.trim() === "") throw new CliUsageError(`--set ${key}= needs a value (JSON, or text)`);
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

/**
 * TorchTitan's command line (`--job.config_file FILE --training.steps 10 --checkpoint.enable`): the recipe file
 * and section.key overrides among the arguments commander did not know; a bare flag sets true.
 */
export function torchtitanArgs(args: readonly string[]): { configFile: string | null; overrides: Record<string, string> } {
  let configFile: string | null = null;
  const overrides: Record<string, string> = {};
  for (let i = 0; i < args.length; i++) {
    const m = /^--([a-z_]+\.[a-z_0-9]+)(?:=(.*))?$/.exec(args[i]!);
    if (!m) throw new CliUsageError(`unknown argument ${JSON.stringify(args[i])} (recipe values: --section.key value, or --set section.key=value)`);
    let value = m[2];
    if (value === undefined) value = i + 1 < args.length && !args[i + 1]!.startsWith("--") ? args[++i]! : "true";
    if (m[1] === "job.config_file") configFile = value;
    else overrides[m[1]!] = value;
  }
  return { configFile, overrides };
}

export function registerTrainCommands(program: Command): void {
  program
    .command("train")
    .description("train a model from a TorchTitan-style TOML recipe and export a Hugging Face directory")
    .option("--config <file>", "recipe TOML file (sections job, model, optimizer, lr_scheduler, training, checkpoint, metrics, validation); TorchTitan's --job.config_file too")
    .option("--set <key=value...>", "override recipe values, e.g. --set training.steps=20 (or TorchTitan's --training.steps 20)", [])
    .option("--no-resume", "start from scratch even if checkpoints exist")
    .allowUnknownOption()
    .allowExcessArguments()
    .action(async (opts: { config?: string; set: string[]; resume: boolean }, cmd: Command) => {
      const titan = torchtitanArgs(cmd.args);
      if (opts.config !== undefined && titan.configFile !== null && opts.config !== titan.configFile)
        throw new CliUsageError(`the recipe is given twice: --config ${opts.config} and --job.config_file ${titan.configFile}`);
      const configFile = opts.config ?? titan.configFile;
      if (configFile === null) throw new CliUsageError("a recipe is needed: --config FILE (or TorchTitan's --job.config_file FILE)");
      const [{ default: cliProgress }, { loadTrainConfig, TrainConfigError }, { runRecipe }] = await Promise.all([
        import("cli-progress"),
        import("../train/train-config.js"),
        import("../train/recipe.js"),
      ]);
      // a recipe the run cannot take (a bad value, unknown key, missing file) is the command line's error: exit 2
      const usage: (e: unknown) => never = (e) => {
        throw e instanceof TrainConfigError ? new CliUsageError(e.message) : e;
      };
      let cfg: ReturnType<typeof loadTrainConfig>;
      try {
        cfg = loadTrainConfig(configFile, { ...titan.overrides, ...parseOverrides(opts.set) });
      } catch (e) {
        usage(e);
      }
      const tty = process.stderr.isTTY;
      const bar = tty ? new cliProgress.SingleBar({ format: "train [{bar}] {value}/{total} steps | loss {loss} | {tps} tok/s | ETA {eta_formatted}", stream: process.stderr }, cliProgress.Presets.shades_classic) : null;
      let started = false;
      const result = await runRecipe(cfg, {
        resume: opts.resume,
        peakFlops: await measurePeakFlops(),
        log: (line) => (bar && started ? bar.updateETA() : undefined, tty && started ? process.stderr.write(`\r\x1b[2K${line}\n`) : console.log(line)),
        onStep: (m, total) => {
          if (!bar) return;
          if (!started) {
            bar.start(total, m.step - 1, { loss: "-", tps: "-" });
            started = true;
          }
          bar.update(m.step, { loss: m.loss.toFixed(3), tps: m.tokensPerSecond.toFixed(0) });
        },
      }).catch(usage);
      bar?.stop();
      if (result.rank !== 0) return; // data parallel (kiln run): rank 0 reports for the job
      console.log(
        JSON.stringify({
          export_dir: result.exportDir,
          params: result.numParams,
          final_loss: result.finalLoss,
          val_loss: result.valLoss,
          val_perplexity: result.valPerplexity,
          tokens_per_second: Math.round(result.tokensPerSecond),
          mfu: Number(result.mfu.toFixed(4)),
          seconds: Math.round(result.seconds),
        }),
      );
    });

  program
    .command("init-model")
    .description("write a random-initialised Hugging Face model directory (for tests and benchmarks)")
    .requiredOption("--out <dir>", "output directory")
    .option("--arch <architecture>", `one of ${SUPPORTED_ARCHITECTURES.join(", ")}`, "LlamaForCausalLM")
    .option("--preset <name>", `shape preset: ${Object.keys(PRESETS).join(", ")}`, "tiny")
    .option("--dtype <dtype>", "float32 or bfloat16", "float32")
    .option("--tokenizer <dir>", "directory with tokenizer.json + tokenizer_config.json (default: the built-in model's)")
    .option("--seed <n>", "weight seed", "0")
    .option("--set <key=value...>", "override config.json fields, e.g. --set num_hidden_layers=4", [])
    .action(async (opts: { out: string; arch: string; preset: string; dtype: string; tokenizer?: string; seed: string; set: string[] }) => {
      if (!(SUPPORTED_ARCHITECTURES as readonly string[]).includes(opts.arch)) throw new CliUsageError(`--arch must be one of ${SUPPORTED_ARCHITECTURES.join(", ")}`);
      if (opts.dtype !== "float32" && opts.dtype !== "bfloat16") throw new CliUsageError("--dtype must be float32 or bfloat16");
      const tokenizerDir = opts.tokenizer ?? DEFAULT_MODEL_DIR;
      if (!fs.existsSync(`${tokenizerDir}/tokenizer.json`)) throw new CliUsageError(`no tokenizer.json in ${tokenizerDir}; pass --tokenizer DIR`);
      const overrides: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(parseOverrides(opts.set))) overrides[k] = configValue(k, v);
      const { initModel } = await import("../models/init-model.js");
      const config = initModel(opts.out, {
        architecture: opts.arch as Architecture,
        preset: opts.preset,
        dtype: opts.dtype,
        tokenizerDir,
        seed: Number(opts.seed),
        overrides,
      });
      console.log(`wrote ${opts.out} (${opts.arch}, hidden ${config.hidden_size}, ${config.num_hidden_layers} layers, vocab ${config.vocab_size})`);
    });

  program
    .command("convert")
    .description("convert a Hugging Face model directory to GGUF (for llama.cpp)")
    .argument("<model-dir>", "Hugging Face model directory")
    .requiredOption("--out <file.gguf>", "output GGUF file")
    .option("--outtype <type>", GGUF_EXPORT_TYPES.join(", "), "F32")
    .action(async (dir: string, opts: { out: string; outtype: string }) => {
      const t = opts.outtype.toUpperCase() as GgufExportType;
      if (!GGUF_EXPORT_TYPES.includes(t)) throw new CliUsageError(`--outtype must be one of ${GGUF_EXPORT_TYPES.join(", ")}`);
      // (the directory is the command line's: a missing one or a file is a usage error, not a bare ENOENT)
      const st = fs.statSync(dir, { throwIfNoEntry: false });
      if (st === undefined) throw new CliUsageError(`model directory ${dir} does not exist`);
      if (!st.isDirectory()) throw new CliUsageError(`${dir} is not a Hugging Face model directory${dir.endsWith(".gguf") ? " (it is already a GGUF file)" : ""}`);
      if (!fs.existsSync(path.join(dir, "config.json"))) throw new CliUsageError(`${dir} has no config.json: not a Hugging Face model directory`);
      const { exportGguf } = await import("../models/init-model.js");
      exportGguf(dir, opts.out, t);
      console.log(`wrote ${opts.out}`);
    });
}
