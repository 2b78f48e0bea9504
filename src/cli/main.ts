// The `kiln` command line: serve | generate | chat | bench serve, plus hooks for train / init-model / convert.
import { Command, CommanderError, Option } from "commander";
import { addBenchServeOptions, parseBenchServeArgs } from "./bench-serve-args.js";
import type { EngineFactory } from "./engine-factory.js";
import type { ClientArgs } from "./openai-client.js";
import { extraCommands } from "./extra-commands.js";
import { addEngineOptions, addServeOptions, CliUsageError, expandMultiLetterShortFlags, parseServeArgs, type ServeArgs } from "./serve-args.js";
import { KILN_VERSION } from "./version.js";

export interface CliDeps {
  engineFactory: EngineFactory;
}

// Commands import their modules when they run: `kiln serve` starts its engine worker before the server and
// model code would have loaded on the main thread.
const lazyEngineFactory: EngineFactory = async (args, progress, whileLoading) =>
  (await import("./engine-factory.js")).createEngineFromArgs(args, progress, whileLoading);

function num(value: unknown, flag: string, { min = 0, int = false } = {}): number {
  const n = Number(value);
  if (typeof value !== "string" || value.trim() === "" || !Number.isFinite(n) || n < min || (int && !Number.isInteger(n))) {
    throw new CliUsageError(`${flag} must be ${int ? "an integer" : "a number"} >= ${min}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/**
 * parseServeArgs, saying each vLLM flag it accepted with no effect (before anything loads); a --tool-parser-plugin
 * is imported first, so that --tool-call-parser may name its parsers.
 */
async function serveArgs(model: string | undefined, opts: Record<string, unknown>): Promise<ServeArgs> {
  if (typeof opts.toolParserPlugin === "string") await (await import("./tool-parser-plugin.js")).loadToolParserPlugin(opts.toolParserPlugin);
  const args = parseServeArgs(model, opts);
  for (const w of args.warnings) process.stderr.write(`kiln: warning: ${w}\n`);
  return args;
}

function addSamplingOptions(cmd: Command): Command {
  return cmd
    // unset, the model's generation_config.json (--generation-config) decides, else generate.ts's CLI_SAMPLING_DEFAULTS
    .option("--max-tokens <n>", "maximum tokens to generate (default: the generation config's max_new_tokens, else 256)")
    .option("--temperature <t>", "sampling temperature, 0 = greedy (default: the generation config's, else 0.7)")
    .option("--top-p <p>", "nucleus sampling probability (default: the generation config's, else 1)"); // --seed comes with the engine options
}

/** generate's and chat's sampling flags where the command line gives them. */
function samplingFlags(opts: Record<string, unknown>): { maxTokens?: number; temperature?: number; topP?: number } {
  return {
    ...(opts.maxTokens !== undefined ? { maxTokens: num(opts.maxTokens, "--max-tokens", { min: 1, int: true }) } : {}),
    ...(opts.temperature !== undefined ? { temperature: num(opts.temperature, "--temperature") } : {}),
    ...(opts.topP !== undefined ? { topP: num(opts.topP, "--top-p") } : {}),
  };
}

/** The flags `kiln chat --url` takes (the rest load a model here). */
const CHAT_CLIENT_FLAGS = ["url", "modelName", "apiKey", "system", "systemPrompt", "quick", "stats", "maxTokens", "temperature", "topP", "seed"];
const COMPLETE_CLIENT_FLAGS = ["url", "modelName", "apiKey", "quick", "stats", "maxTokens"];

/** A client command's arguments: sampling fields only where the command line set them (else the server's defaults). */
function clientArgs(opts: Record<string, unknown>, cmd: Command, allowed: readonly string[]): ClientArgs {
  const given = cmd.options.map((o) => o.attributeName()).filter((name) => cmd.getOptionValueSource(name) === "cli");
  const stray = given.filter((name) => !allowed.includes(name));
  if (stray.length > 0) {
    const flags = stray.map((name) => cmd.options.find((o) => o.attributeName() === name)!.long).join(", ");
    throw new CliUsageError(`${flags} configure${stray.length === 1 ? "s" : ""} a model loaded here: with --url the server's model answers`);
  }
  const sampling: Record<string, number> = {};
  const set = (name: string, field: string, rule: Parameters<typeof num>[2]): void => {
    if (given.includes(name)) sampling[field] = num(opts[name], `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`, rule);
  };
  set("maxTokens", "max_tokens", { min: 1, int: true });
  set("temperature", "temperature", {});
  set("topP", "top_p", {});
  set("seed", "seed", { int: true });
  return {
    url: (opts.url as string | undefined) ?? "http://localhost:8000/v1",
    modelName: (opts.modelName as string | undefined) ?? null,
    apiKey: (opts.apiKey as string | undefined) ?? process.env.OPENAI_API_KEY ?? null,
    quick: (opts.quick as string | undefined) ?? null,
    stats: opts.stats === true,
    sampling,
  };
}

export function buildProgram(deps: CliDeps = { engineFactory: lazyEngineFactory }): Command {
  const program = new Command("kiln")
    .description("Kiln: vLLM-compatible LLM serving, tensor runtime and training recipes in TypeScript")
    .version(KILN_VERSION)
    .showHelpAfterError("(run with --help for usage)");

  // serve's flags, on the command and on the one that parses a --config file's
  const serveOptions = (cmd: Command): Command =>
    addServeOptions(cmd)
      .option("--model <dir>", "the model, as the positional argument gives it (vLLM accepts both)")
      .option("--config <file>", "a YAML file of serve flags (keys: flag names, snake_case or kebab-case); flags given here override it");
  serveOptions(
    program.command("serve").description("start the OpenAI-compatible server").argument("[model]", "model directory (default: the built-in model)"),
  )
    .action(async (positional: string | undefined, cliOpts: Record<string, unknown>, cmd: Command) => {
      const opts = cliOpts.config === undefined
        ? cliOpts
        : (await import("./serve-config-file.js")).withConfigFile(cmd, () => serveOptions(new Command("serve")));
      const flag = opts.model as string | undefined;
      // a model in the --config file gives way to the command line's, as in vLLM
      if (positional !== undefined && cmd.getOptionValueSource("model") === "cli" && positional !== flag)
        throw new CliUsageError(`the model is given twice: ${JSON.stringify(positional)} and --model ${JSON.stringify(flag)}`);
      const { runServe } = await import("./serve.js");
      await runServe(await serveArgs(positional ?? flag, opts), deps.engineFactory);
    });

  // vllm run-batch: OpenAI's batch file format through the server's routes, in this process
  const runBatchOptions = (cmd: Command): Command =>
    serveOptions(cmd)
      .requiredOption("-i, --input-file <file-or-url>", "the batch: one {custom_id, method, url, body} JSON object per line (a path, or an http(s) URL read with GET)")
      .requiredOption("-o, --output-file <file-or-url>", "where the results go, one line per request in input order (a path, or an http(s) URL written with PUT)")
      .option("--output-tmp-dir <dir>", "accepted for vLLM's command lines (Kiln sends an output URL its results from memory)")
      .option("--enable-metrics", "serve Prometheus metrics at http://<--url>:<--port>/metrics while the batch runs", false)
      .option("--url <host>", "the metrics server's host (with --enable-metrics)", "0.0.0.0");
  runBatchOptions(program.command("run-batch").description("run a file of OpenAI requests offline (as `vllm run-batch`)").argument("[model]", "model directory (default: the built-in model)"))
    .action(async (positional: string | undefined, cliOpts: Record<string, unknown>, cmd: Command) => {
      const opts = cliOpts.config === undefined
        ? cliOpts
        : (await import("./serve-config-file.js")).withConfigFile(cmd, () => runBatchOptions(new Command("run-batch")));
      const flag = opts.model as string | undefined;
      if (positional !== undefined && flag !== undefined && positional !== flag)
        throw new CliUsageError(`the model is given twice: ${JSON.stringify(positional)} and --model ${JSON.stringify(flag)}`);
      const args = await serveArgs(positional ?? flag, opts);
      const { runBatch } = await import("./run-batch.js");
      await runBatch(args, {
        inputFile: opts.inputFile as string,
        outputFile: opts.outputFile as string,
        enableMetrics: Boolean(opts.enableMetrics),
        metricsHost: opts.url as string,
        metricsPort: args.port,
      }, deps.engineFactory);
    });

  addSamplingOptions(addEngineOptions(program.command("generate").description("generate one completion")))
    .option("--model <dir>", "model directory or GGUF file (default: the built-in model)")
    .requiredOption("--prompt <text>", "prompt text")
    .option("--stream", "print tokens as they are generated", false)
    .option("--chat", "wrap the prompt in the chat template as a user message", false)
    .option("--chat-template <file-or-template>", "chat template file or inline template")
    .action(async (opts: Record<string, unknown>) => {
      const args = await serveArgs(opts.model as string | undefined, opts);
      const { runGenerate } = await import("./generate.js");
      await runGenerate(args, {
        prompt: opts.prompt as string,
        ...samplingFlags(opts),
        seed: num(opts.seed, "--seed", { int: true }),
        stream: Boolean(opts.stream),
        chat: Boolean(opts.chat),
      }, deps.engineFactory);
    });

  addSamplingOptions(addEngineOptions(program.command("chat").description("interactive chat in the terminal: a model loaded here, or a running server's with --url (as `vllm chat`)"), { quantizationShort: false }))
    .option("--model <dir>", "model directory or GGUF file (default: the built-in model)")
    .option("--system <text>", "system prompt")
    .option("--system-prompt <text>", "vLLM's name of --system")
    .option("--chat-template <file-or-template>", "chat template file or inline template")
    .option("-q, --quick <message>", "send this one message, print the reply, then exit")
    .addOption(new Option("--url <url>", "talk to the OpenAI-compatible server at this base URL instead of loading a model (`vllm chat`; --model-name, --api-key and the sampling flags then apply, no engine flag)"))
    .option("--model-name <name>", "with --url: the served model to ask (default: the server's first)")
    .option("--api-key <key>", "with --url: the server's API key (default: OPENAI_API_KEY)")
    .option("--stats", "with --url: print time to first token and tokens/s after each reply", false)
    .action(async (opts: Record<string, unknown>, cmd: Command) => {
      if (opts.system !== undefined && opts.systemPrompt !== undefined && opts.system !== opts.systemPrompt)
        throw new CliUsageError("the system prompt is given twice: --system and --system-prompt differ");
      const system = ((opts.systemPrompt ?? opts.system) as string | undefined) ?? null;
      const quick = (opts.quick as string | undefined) ?? null;
      if (opts.url !== undefined || opts.modelName !== undefined || opts.apiKey !== undefined) {
        const { runClientChat } = await import("./openai-client.js");
        return runClientChat({ ...clientArgs(opts, cmd, CHAT_CLIENT_FLAGS), systemPrompt: system });
      }
      if (opts.stats === true) throw new CliUsageError("--stats times a server's replies: give its --url");
      const args = await serveArgs(opts.model as string | undefined, opts);
      const { runChat } = await import("./generate.js");
      await runChat(args, {
        ...samplingFlags(opts),
        seed: num(opts.seed, "--seed", { int: true }),
        system,
        quick,
      }, deps.engineFactory);
    });

  program.command("complete").description("complete prompts with a running server's /v1/completions (as `vllm complete`)")
    .option("--url <url>", "the OpenAI-compatible server's base URL", "http://localhost:8000/v1")
    .option("--model-name <name>", "the served model to ask (default: the server's first)")
    .option("--api-key <key>", "the server's API key (default: OPENAI_API_KEY)")
    .option("--max-tokens <n>", "maximum tokens to generate per completion (default: the server's)")
    .option("-q, --quick <prompt>", "complete this one prompt, print it, then exit")
    .option("--stats", "print time to first token and tokens/s after each completion", false)
    .action(async (opts: Record<string, unknown>, cmd: Command) => {
      const { runClientComplete } = await import("./openai-client.js");
      await runClientComplete(clientArgs(opts, cmd, COMPLETE_CLIENT_FLAGS));
    });

  program.command("collect-env").description("print the machine, install and environment facts a bug report needs (as `vllm collect-env`)")
    .action(async () => {
      (await import("./collect-env.js")).runCollectEnv();
    });

  const bench = program.command("bench").description("benchmarks");
  addBenchServeOptions(bench.command("serve").description("benchmark a running server (as `vllm bench serve`)"))
    .action(async (o: Record<string, unknown>) => {
      const args = parseBenchServeArgs(o);
      const { runBenchServe } = await import("./bench-serve.js");
      const result = await runBenchServe(args);
      if (result.completed === 0) throw new Error("every request failed");
    });

  // vllm bench latency / throughput: the engine in this process, with every engine flag of serve
  const offline = (name: string, description: string) =>
    addEngineOptions(bench.command(name).description(description))
      .option("--model <dir>", "model directory or GGUF file (default: the built-in model)")
      .option("--input-len <n>", "prompt tokens per request (random ids)", "32")
      .option("--output-len <n>", "generated tokens per request (EOS ignored)", "128")
      .option("--output-json <file>", "write the results as JSON (vLLM's keys)");
  const offlineArgs = (o: Record<string, unknown>) => ({
    inputLen: num(o.inputLen, "--input-len", { min: 1, int: true }),
    outputLen: num(o.outputLen, "--output-len", { min: 1, int: true }),
    seed: num(o.seed ?? "0", "--seed", { int: true }),
    outputJson: (o.outputJson as string | undefined) ?? null,
  });
  offline("latency", "latency of one batch end to end, in this process (as `vllm bench latency`)")
    .option("--batch-size <n>", "requests in the batch", "8")
    .option("--num-iters-warmup <n>", "batches run before timing", "10")
    .option("--num-iters <n>", "batches timed", "30")
    .action(async (o: Record<string, unknown>) => {
      const a = {
        ...offlineArgs(o), batchSize: num(o.batchSize, "--batch-size", { min: 1, int: true }),
        numItersWarmup: num(o.numItersWarmup, "--num-iters-warmup", { int: true }), numIters: num(o.numIters, "--num-iters", { min: 1, int: true }),
      };
      const { runBenchLatency } = await import("./bench-offline.js");
      await runBenchLatency(parseServeArgs(o.model as string | undefined, o), a, deps.engineFactory);
    });
  offline("throughput", "offline throughput of many requests at once, in this process (as `vllm bench throughput`)")
    .option("--num-prompts <n>", "requests", "1000")
    .action(async (o: Record<string, unknown>) => {
      const a = { ...offlineArgs(o), numPrompts: num(o.numPrompts, "--num-prompts", { min: 1, int: true }) };
      const { runBenchThroughput } = await import("./bench-offline.js");
      await runBenchThroughput(parseServeArgs(o.model as string | undefined, o), a, deps.engineFactory);
    });

  // Hook: train, init-model, convert (and later commands) are registered from src/cli/extra-commands.ts.
  for (const register of extraCommands) register(program);
  return program;
}

/** Runs the CLI; resolves with the process exit code. */
export async function main(argv: string[] = process.argv, deps?: CliDeps): Promise<number> {
  const program = buildProgram(deps);
  // every command throws its parse errors here (a subcommand made before this call does not inherit it)
  const withSubcommands = (c: Command): Command[] => [c, ...c.commands.flatMap(withSubcommands)];
  for (const c of withSubcommands(program)) c.exitOverride();
  try {
    // vLLM's -tp / -pp / -dp (commander's short flags are one letter) in the engine commands' words
    const [node = "node", script = "kiln", command, ...rest] = argv;
    const engineCommand = command === "serve" || command === "run-batch" || command === "generate" || command === "chat";
    await program.parseAsync(engineCommand ? [node, script, command, ...expandMultiLetterShortFlags(rest)] : argv);
    return 0;
  } catch (err) {
    // commander already printed the message; a command line it refuses (unknown flag or command, missing or invalid
    // value) exits 2 as Kiln's own usage errors do (and argparse's, vLLM's)
    if (err instanceof CommanderError) return err.exitCode === 0 || err.code === "commander.help" ? err.exitCode : 2;
    process.stderr.write(`kiln: error: ${(err as Error).message}\n`);
    return err instanceof CliUsageError ? 2 : 1;
  }
}
