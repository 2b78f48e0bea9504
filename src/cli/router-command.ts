// `kiln router`: the fleet front door over several `kiln serve` workers, with vllm-router's flag names and defaults
// (--worker-urls, --policy cache_aware|round_robin|random|power_of_two, the cache_aware thresholds, health checks,
// timeouts, retries), plus --policy weighted with llm-d's scorer weights and --policy precise_prefix (llm-d's precise
// prefix-cache scorer, fed by the workers' KV-cache events over NATS: --kv-events-endpoint, --tokenizer), and
// vllm-router's P/D disaggregation (--pd-disaggregation --prefill <url> [bootstrap_port] --decode <url>, each with its
// policy), and vllm-router's Kubernetes service discovery (--service-discovery --selector key=value, or with P/D
// --prefill-selector and --decode-selector). Flags are parsed into the router's one typed RouterConfig; a bad value is
// a usage error.
import { Option, type Command } from "commander";
// the config modules only: fastify and the proxy load when the command runs, not with every `kiln` command
import { DEFAULT_ROUTER_CONFIG, MAX_TIMER_MS, resolveRouterConfig, RouterConfigError, type PrefillUrl, type RouterConfig } from "../router/router-config.js";
import { POLICY_NAMES } from "../router/routing-types.js";
import { CHAT_CONTENT_FORMATS, type ChatContentFormat } from "../models/chat-content-format.js";
import { jsonObjectFlag } from "./serve-flag-values.js";
import { parseMmArgs } from "./serve-mm-args.js";
import { parseChatTemplate } from "./serve-chat-args.js";
import { CliUsageError } from "./usage-error.js";

const D = DEFAULT_ROUTER_CONFIG;
const MAX_TIMER_SECS = Math.floor(MAX_TIMER_MS / 1000);
const LOG_LEVELS = ["debug", "info", "warning", "error", "critical"] as const;

export function registerRouterCommand(program: Command): void {
  program
    .command("router")
    .description("route OpenAI requests across several `kiln serve` workers, aware of their prefix caches and load (vllm-router's flags)")
    .option("--worker-urls <urls...>", "worker base URLs, e.g. http://127.0.0.1:8001 http://127.0.0.1:8002 (not with --pd-disaggregation)")
    .option("--host <host>", "host name to listen on", D.host)
    .option("--port <port>", "port to listen on (0: any free port)", String(D.port))
    .addOption(new Option("--policy <policy>", "routing policy").choices([...POLICY_NAMES]).default(D.policy))
    .option("--pd-disaggregation", "P/D disaggregation: each completion's prompt runs on a --prefill worker, which hands its KV cache to a --decode worker that generates (vLLM's NixlConnector kv_transfer_params)", false)
    .option("--vllm-pd-disaggregation", "vllm-router's other name of --pd-disaggregation", false)
    .option("--prefill <url-and-port...>", "P/D: a prefill worker URL, optionally followed by its KV bootstrap port (Mooncake's; NIXL needs none); repeat the flag or list several")
    .option("--decode <urls...>", "P/D: decode worker URLs (they also serve every route but the completions); repeat the flag or list several")
    .addOption(new Option("--prefill-policy <policy>", "P/D: policy over the prefill workers (default: --policy)").choices([...POLICY_NAMES]))
    .addOption(new Option("--decode-policy <policy>", "P/D: policy over the decode workers (default: --policy)").choices([...POLICY_NAMES]))
    .option("--service-discovery", "Kubernetes service discovery: pods matching --selector (P/D: --prefill-selector, --decode-selector) are workers while Running and Ready (static URLs optional)", false)
    .option("--selector <key=value...>", "service discovery: labels every worker pod has, e.g. app=kiln component=serve")
    .option("--service-discovery-port <port>", "service discovery: the port the workers listen on in each pod", String(D.serviceDiscoveryPort))
    .option("--service-discovery-namespace <ns>", "service discovery: the namespace to watch (default: every namespace, which needs a ClusterRole)")
    .option("--prefill-selector <key=value...>", "P/D service discovery: labels of the prefill pods (a pod matching both selectors is a prefill worker)")
    .option("--decode-selector <key=value...>", "P/D service discovery: labels of the decode pods")
    .option("--bootstrap-port-annotation <key>", "P/D service discovery: the prefill pods' annotation holding their KV bootstrap port", D.bootstrapPortAnnotation)
    .option("--service-discovery-api-url <url>", "service discovery: the Kubernetes API's base URL (default: in-cluster, with the pod's service account; e.g. http://127.0.0.1:8001 behind `kubectl proxy`)")
    .option("--cache-threshold <ratio>", "cache_aware: a prefix match routes to its worker when matched/length is over this (0..1)", String(D.cacheThreshold))
    .option("--balance-abs-threshold <n>", "cache_aware: the fleet is imbalanced when max - min load is over this ...", String(D.balanceAbsThreshold))
    .option("--balance-rel-threshold <x>", "... and max load is over min load times this (>= 1); then the least loaded worker is chosen", String(D.balanceRelThreshold))
    .option("--eviction-interval-secs <s>", "cache_aware: seconds between trims of the prefix tree to --max-tree-size", String(D.evictionIntervalMs / 1000))
    .option("--eviction-interval <s>", "vllm-router's Rust spelling of --eviction-interval-secs")
    .option("--max-tree-size <chars>", "cache_aware: characters of request text remembered per worker", String(D.maxTreeSize))
    .option("--prefix-cache-scorer-weight <w>", "weighted: weight of the prefix-cache scorer (matched/length per worker)", String(D.prefixCacheScorerWeight))
    .option("--queue-scorer-weight <w>", "weighted: weight of the queue scorer (least loaded 1, most loaded 0)", String(D.queueScorerWeight))
    .option("--kv-cache-utilization-scorer-weight <w>", "weighted: weight of the KV-cache scorer (1 - vllm:kv_cache_usage_perc)", String(D.kvCacheUtilizationScorerWeight))
    .option("--precise-prefix-cache-scorer-weight <w>", "weighted: weight of the precise prefix-cache scorer (held prompt blocks per worker, from KV events; needs --kv-events-endpoint and --tokenizer)", String(D.precisePrefixCacheScorerWeight))
    .option("--kv-events-endpoint <url>", "nats://host:port where the workers publish KV-cache events (kiln serve --kv-events-config); feeds precise_prefix")
    .option("--kv-events-topic <subject>", "the NATS subject of those events (the workers' topic)", D.kvEventsTopic)
    .option("--tokenizer <dir>", "the model's directory (tokenizer.json, chat template; an image-text model's config.json and preprocessor_config.json for image chats): requests are tokenized and hashed as the workers do")
    .option("--chat-template <file-or-text>", "the workers' --chat-template, when they were given one (precise routing renders chat requests with it)")
    .addOption(new Option("--chat-template-content-format <format>", "the workers' --chat-template-content-format (precise routing renders chats as they do)").choices([...CHAT_CONTENT_FORMATS]))
    .option("--default-chat-template-kwargs <json>", "the workers' --default-chat-template-kwargs")
    .option("--mm-processor-kwargs <json>", "the workers' --mm-processor-kwargs (image chats are processed and hashed as they process them)")
    .option("--media-io-kwargs <json>", "the workers' --media-io-kwargs")
    .option("--interleave-mm-strings", "the workers were started with --interleave-mm-strings", false)
    .option("--health-check-interval-secs <s>", "seconds between health checks of every worker", String(D.healthCheckIntervalMs / 1000))
    .option("--health-check-timeout-secs <s>", "a health check not answered by then fails", String(D.healthCheckTimeoutMs / 1000))
    .option("--health-failure-threshold <n>", "failed checks in a row before a worker is marked down", String(D.healthFailureThreshold))
    .option("--health-success-threshold <n>", "passed checks in a row before a down worker is used again", String(D.healthSuccessThreshold))
    .option("--health-check-endpoint <path>", "each worker's health path", D.healthCheckEndpoint)
    .option("--request-timeout-secs <s>", "a worker's response must have ended by then (504 when nothing was sent yet)", String(D.requestTimeoutMs / 1000))
    .option("--max-retries <n>", `other workers a request may go to when its worker cannot be reached or answers 502/503/504 (default ${D.maxRetries})`)
    .option("--retry-max-retries <n>", "vllm-router's name of --max-retries")
    .option("--disable-retries", "never send a request to a second worker (same as --max-retries 0)", false)
    .option("--max-payload-size <bytes>", "largest request body (413 above)", String(D.maxPayloadSize))
    .option("--max-inflight-per-worker <n>", "requests in flight per worker before it takes no more; 429 when all are full (0: no limit)", String(D.maxInflightPerWorker))
    .option("--cors-allowed-origins <origins...>", "origins browsers may call the router from (default: any)")
    .addOption(new Option("--log-level <level>", "log level (debug: one line per routing decision)").choices([...LOG_LEVELS]).default(D.logLevel))
    .action(async (opts: Record<string, unknown>) => {
      await runRouter(parseRouterArgs(opts));
    });
}

function number(value: unknown, flag: string, { min = 0, max = Infinity, int = false, above = false } = {}): number {
  const n = Number(value);
  const ok = typeof value === "string" && value.trim() !== "" && Number.isFinite(n) && (above ? n > min : n >= min) && n <= max && (!int || Number.isInteger(n));
  if (!ok) {
    const range = max === Infinity ? `${above ? ">" : ">="} ${min}` : `in ${above ? "(" : "["}${min}, ${max}]`;
    throw new CliUsageError(`${flag} must be ${int ? "an integer" : "a number"} ${range}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/** The workers' prompt-shaping flags, read as `kiln serve` reads them. */
function workerPromptArgs(o: Record<string, unknown>): RouterConfig["workerPrompt"] {
  const mm = parseMmArgs(o, []);
  return {
    ...(o.chatTemplateContentFormat !== undefined ? { contentFormat: o.chatTemplateContentFormat as ChatContentFormat } : {}),
    ...(o.defaultChatTemplateKwargs !== undefined ? { defaultChatTemplateKwargs: jsonObjectFlag(o.defaultChatTemplateKwargs, "--default-chat-template-kwargs", '{"enable_thinking": false}') } : {}),
    ...(mm.mmProcessorKwargs !== null ? { mmProcessorKwargs: mm.mmProcessorKwargs } : {}),
    ...(mm.rgbaBackground !== null ? { rgbaBackground: mm.rgbaBackground } : {}),
    ...(mm.interleaveMmStrings ? { interleaveMmStrings: true } : {}),
  };
}

/** A list flag's values, commas splitting too (--worker-urls a,b). */
function listArg(value: unknown): string[] {
  const values = (Array.isArray(value) ? value : [value]).filter((u): u is string => typeof u === "string");
  return values.flatMap((u) => u.split(",")).map((u) => u.trim()).filter((u) => u !== "");
}

/** --prefill's values as vllm-router reads them: each URL, optionally followed by its bootstrap port (or "none"). */
export function prefillArgs(value: unknown): PrefillUrl[] {
  const out: PrefillUrl[] = [];
  let portGiven = false;
  for (const token of listArg(value)) {
    const none = token.toLowerCase() === "none";
    if (!none && !/^\d+$/.test(token)) {
      out.push({ url: token, bootstrapPort: null });
      portGiven = false;
      continue;
    }
    const last = out.at(-1);
    if (last === undefined || portGiven) throw new CliUsageError(`--prefill: ${token} must follow a URL (--prefill <url> [bootstrap_port])`);
    last.bootstrapPort = none ? null : number(token, "--prefill's bootstrap port", { max: 65535, int: true });
    portGiven = true;
  }
  return out;
}

/** A selector flag's key=value items (listed, repeated or comma-separated) as labels; a key given twice must agree. */
export function selectorArg(value: unknown, flag: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of listArg(value)) {
    const eq = item.indexOf("=");
    if (eq <= 0) throw new CliUsageError(`${flag} takes key=value labels, e.g. ${flag} app=kiln; got ${JSON.stringify(item)}`);
    const [k, v] = [item.slice(0, eq), item.slice(eq + 1)];
    if (k in out && out[k] !== v) throw new CliUsageError(`${flag} gives label ${k} twice (${out[k]} and ${v}): no pod would match`);
    out[k] = v;
  }
  return out;
}

/** Validates commander's raw values into a RouterConfig (CliUsageError naming the flag). */
export function parseRouterArgs(o: Record<string, unknown>): RouterConfig {
  const pdDisaggregation = o.pdDisaggregation === true || o.vllmPdDisaggregation === true;
  const serviceDiscovery = o.serviceDiscovery === true;
  const workerUrls = listArg(o.workerUrls);
  const prefillUrls = prefillArgs(o.prefill);
  const decodeUrls = listArg(o.decode);
  const selector = selectorArg(o.selector, "--selector");
  const prefillSelector = selectorArg(o.prefillSelector, "--prefill-selector");
  const decodeSelector = selectorArg(o.decodeSelector, "--decode-selector");
  const has = (s: Record<string, string>): boolean => Object.keys(s).length > 0;
  if (!serviceDiscovery && (has(selector) || has(prefillSelector) || has(decodeSelector) || o.serviceDiscoveryNamespace !== undefined || o.serviceDiscoveryApiUrl !== undefined))
    throw new CliUsageError("--selector, --prefill-selector, --decode-selector, --service-discovery-namespace and --service-discovery-api-url need --service-discovery");
  if (pdDisaggregation) {
    if (workerUrls.length > 0) throw new CliUsageError("--pd-disaggregation takes its workers from --prefill and --decode, not --worker-urls");
    if (!serviceDiscovery && (prefillUrls.length === 0 || decodeUrls.length === 0))
      throw new CliUsageError("--pd-disaggregation needs at least one --prefill and one --decode worker URL, e.g. --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 (or --service-discovery with --prefill-selector and --decode-selector)");
    if (has(selector)) throw new CliUsageError("with --pd-disaggregation, service discovery selects pods by --prefill-selector and --decode-selector, not --selector");
    for (const [role, urls, sel] of [["prefill", prefillUrls, prefillSelector], ["decode", decodeUrls, decodeSelector]] as const)
      if (serviceDiscovery && urls.length === 0 && !has(sel)) throw new CliUsageError(`--pd-disaggregation --service-discovery needs --${role}-selector key=value (or --${role} URLs)`);
  } else {
    if (prefillUrls.length > 0 || decodeUrls.length > 0 || o.prefillPolicy !== undefined || o.decodePolicy !== undefined || has(prefillSelector) || has(decodeSelector))
      throw new CliUsageError("--prefill, --decode, --prefill-selector, --decode-selector, --prefill-policy and --decode-policy need --pd-disaggregation");
    if (serviceDiscovery && !has(selector)) throw new CliUsageError("--service-discovery needs --selector key=value ..., the labels of the worker pods (e.g. --selector app=kiln)");
    if (workerUrls.length === 0 && !serviceDiscovery)
      throw new CliUsageError("--worker-urls needs at least one URL, e.g. http://127.0.0.1:8001 (or --pd-disaggregation with --prefill and --decode, or --service-discovery --selector key=value)");
  }
  // Node's timers take at most 2^31 - 1 ms (~24.8 days): a longer one fires after 1 ms
  const secs = (key: string, flag: string): number => number(o[key], flag, { min: 0, above: true, max: MAX_TIMER_SECS }) * 1000;
  if (o.maxRetries !== undefined && o.retryMaxRetries !== undefined && o.maxRetries !== o.retryMaxRetries)
    throw new CliUsageError("--max-retries and --retry-max-retries disagree: give one");
  const retries = o.retryMaxRetries !== undefined ? number(o.retryMaxRetries, "--retry-max-retries", { int: true })
    : o.maxRetries !== undefined ? number(o.maxRetries, "--max-retries", { int: true }) : D.maxRetries;
  const endpoint = String(o.healthCheckEndpoint);
  if (!endpoint.startsWith("/")) throw new CliUsageError(`--health-check-endpoint must be a path such as /health, got ${JSON.stringify(endpoint)}`);
  const partial: Partial<RouterConfig> = {
    workerUrls,
    pdDisaggregation,
    prefillUrls,
    decodeUrls,
    prefillPolicy: (o.prefillPolicy as RouterConfig["prefillPolicy"] | undefined) ?? null,
    decodePolicy: (o.decodePolicy as RouterConfig["decodePolicy"] | undefined) ?? null,
    serviceDiscovery,
    selector,
    prefillSelector,
    decodeSelector,
    serviceDiscoveryPort: number(o.serviceDiscoveryPort, "--service-discovery-port", { min: 1, max: 65535, int: true }),
    serviceDiscoveryNamespace: (o.serviceDiscoveryNamespace as string | undefined) ?? null,
    bootstrapPortAnnotation: String(o.bootstrapPortAnnotation),
    serviceDiscoveryApiUrl: (o.serviceDiscoveryApiUrl as string | undefined) ?? null,
    host: String(o.host),
    port: number(o.port, "--port", { max: 65535, int: true }),
    policy: o.policy as RouterConfig["policy"],
    cacheThreshold: number(o.cacheThreshold, "--cache-threshold", { max: 1 }),
    balanceAbsThreshold: number(o.balanceAbsThreshold, "--balance-abs-threshold", { int: true }),
    balanceRelThreshold: number(o.balanceRelThreshold, "--balance-rel-threshold", { min: 1 }),
    evictionIntervalMs: o.evictionInterval !== undefined ? secs("evictionInterval", "--eviction-interval") : secs("evictionIntervalSecs", "--eviction-interval-secs"),
    maxTreeSize: number(o.maxTreeSize, "--max-tree-size", { min: 1, int: true }),
    prefixCacheScorerWeight: number(o.prefixCacheScorerWeight, "--prefix-cache-scorer-weight"),
    queueScorerWeight: number(o.queueScorerWeight, "--queue-scorer-weight"),
    kvCacheUtilizationScorerWeight: number(o.kvCacheUtilizationScorerWeight, "--kv-cache-utilization-scorer-weight"),
    precisePrefixCacheScorerWeight: number(o.precisePrefixCacheScorerWeight, "--precise-prefix-cache-scorer-weight"),
    kvEventsEndpoint: (o.kvEventsEndpoint as string | undefined) ?? null,
    kvEventsTopic: String(o.kvEventsTopic),
    tokenizer: (o.tokenizer as string | undefined) ?? null,
    chatTemplate: parseChatTemplate(o.chatTemplate), // as `kiln serve` reads it
    workerPrompt: workerPromptArgs(o),
    healthCheckIntervalMs: secs("healthCheckIntervalSecs", "--health-check-interval-secs"),
    healthCheckTimeoutMs: secs("healthCheckTimeoutSecs", "--health-check-timeout-secs"),
    healthFailureThreshold: number(o.healthFailureThreshold, "--health-failure-threshold", { min: 1, int: true }),
    healthSuccessThreshold: number(o.healthSuccessThreshold, "--health-success-threshold", { min: 1, int: true }),
    healthCheckEndpoint: endpoint,
    requestTimeoutMs: secs("requestTimeoutSecs", "--request-timeout-secs"),
    maxRetries: o.disableRetries === true ? 0 : retries,
    maxPayloadSize: number(o.maxPayloadSize, "--max-payload-size", { min: 1, int: true }),
    maxInflightPerWorker: number(o.maxInflightPerWorker, "--max-inflight-per-worker", { int: true }),
    corsAllowedOrigins: ((o.corsAllowedOrigins as string[] | undefined) ?? []).flatMap((x) => x.split(",")).map((x) => x.trim()).filter((x) => x !== ""),
    logLevel: o.logLevel as RouterConfig["logLevel"],
  };
  try {
    return resolveRouterConfig(partial);
  } catch (e) {
    if (e instanceof RouterConfigError) throw new CliUsageError(e.message); // the checks left: worker URLs, the KV-events endpoint, what precise routing needs
    throw e;
  }
}

/** Starts the router, prints its banner, and on SIGTERM/SIGINT lets in-flight responses finish before exiting. */
export async function runRouter(config: RouterConfig, out: NodeJS.WritableStream = process.stdout): Promise<void> {
  const { createRouter } = await import("../router/index.js");
  const router = createRouter(config);
  const url = await router.listen();
  const healthy = (pool: { healthy(): unknown[]; all(): { url: string }[] }): string =>
    `${pool.healthy().length}/${pool.all().length} workers healthy${pool.all().map((w) => ` ${w.url}`).join("").replace(/^ /, ": ")}`;
  const fleet = router.prefill === null ? `policy ${config.policy}, ${healthy(router.pool)}`
    : `P/D disaggregation; prefill policy ${router.prefill.policy.name}, ${healthy(router.prefill.pool)}; decode policy ${router.policy.name}, ${healthy(router.pool)}`;
  const discovery = router.discovery?.status();
  const pods = discovery === undefined ? ""
    : `; service discovery of pods ${discovery.watches.map((w) => (w.role === "regular" ? w.selector : `${w.role} ${w.selector}`)).join(", ")} ` +
      `in ${discovery.namespace === null ? "every namespace" : `namespace ${discovery.namespace}`}, port ${discovery.port}`;
  out.write(`Kiln router at ${url}/v1 (${fleet}${pods})\n`);
  await new Promise<void>((resolve) => {
    const onSignal = (signal: NodeJS.Signals): void => {
      process.off("SIGTERM", onSignal).off("SIGINT", onSignal);
      process.stderr.write(`Received ${signal}: the router stops once in-flight responses have ended\n`);
      const force = setTimeout(() => router.app.server.closeAllConnections(), 30_000);
      force.unref();
      void router.close().finally(() => {
        clearTimeout(force);
        resolve();
      });
    };
    process.on("SIGTERM", onSignal).on("SIGINT", onSignal);
  });
}
