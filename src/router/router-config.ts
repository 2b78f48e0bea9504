// The router's one typed config (vllm-router's flags and defaults, in milliseconds where it says seconds), and the
// check of its invariants at construction. `kiln router` parses its flags into it (src/cli/router-args.ts).
import type { WorkerPromptSettings } from "./request-tokens.js";
import { KilnError } from "../util/errors.js";
import { POLICY_NAMES, type PolicyName } from "./routing-types.js";
import { normalizeWorkerUrl } from "./worker-pool.js";

/** A prefill worker of P/D disaggregation, with the KV-transfer bootstrap port vllm-router's --prefill may name. */
export interface PrefillUrl {
  url: string;
  /** Mooncake's and SGLang's rendezvous port; NixlConnector needs none (shown by /workers only). */
  bootstrapPort: number | null;
}

export interface RouterConfig {
  /** Worker base URLs (http://host:port, no /v1); empty with pdDisaggregation. */
  workerUrls: string[];
  host: string;
  port: number;
  policy: PolicyName;
  /**
   * P/D disaggregation (vllm-router's --pd-disaggregation): /v1/completions and /v1/chat/completions run their prompt
   * on a prefill worker, then generate on a decode worker that pulls the prompt's KV cache (vLLM's NixlConnector
   * kv_transfer_params); every other route goes to a decode worker.
   */
  pdDisaggregation: boolean;
  /** P/D: the prefill workers. */
  prefillUrls: PrefillUrl[];
  /** P/D: the decode workers. */
  decodeUrls: string[];
  /** P/D: the policy over prefill (decode) workers; null = `policy`. */
  prefillPolicy: PolicyName | null;
  decodePolicy: PolicyName | null;
  /**
   * Kubernetes service discovery (vllm-router's --service-discovery): pods matching `selector` (P/D: `prefillSelector`,
   * `decodeSelector`) join the fleet as http://<podIP>:<serviceDiscoveryPort> while Running and Ready, beside any
   * static URLs; the router may start with none.
   */
  serviceDiscovery: boolean;
  /** Labels a worker pod has, all of them (key=value, ANDed as the API's labelSelector); empty with P/D. */
  selector: Record<string, string>;
  /** P/D: labels of the prefill pods (a pod matching both selectors is a prefill worker, as in vllm-router). */
  prefillSelector: Record<string, string>;
  /** P/D: labels of the decode pods. */
  decodeSelector: Record<string, string>;
  /** The port the workers listen on in each pod. */
  serviceDiscoveryPort: number;
  /** The namespace to watch; null watches every namespace (the router's account then needs a ClusterRole). */
  serviceDiscoveryNamespace: string | null;
  /** The prefill pods' annotation giving their KV bootstrap port (shown by /workers, as --prefill's). */
  bootstrapPortAnnotation: string;
  /** The API's base URL (`kubectl proxy`'s http://127.0.0.1:8001, a test's fake); null: in-cluster, the pod's service account. */
  serviceDiscoveryApiUrl: string | null;
  cacheThreshold: number;
  balanceAbsThreshold: number;
  balanceRelThreshold: number;
  /** How often cache_aware trims its tree to maxTreeSize. */
  evictionIntervalMs: number;
  /** Characters cache_aware's (and weighted's) tree keeps per worker. */
  maxTreeSize: number;
  /** weighted: the scorers' weights (llm-d's default profile: 3, 2, 2). */
  prefixCacheScorerWeight: number;
  queueScorerWeight: number;
  kvCacheUtilizationScorerWeight: number;
  /** weighted: llm-d's precise-prefix-cache scorer (needs kvEventsEndpoint and tokenizer); 0 = off. */
  precisePrefixCacheScorerWeight: number;
  /** nats://host:port the workers publish their KV-cache events on (`kiln serve --kv-events-config`); null = none. */
  kvEventsEndpoint: string | null;
  /** The subject (vLLM's topic) of those events. */
  kvEventsTopic: string;
  /**
   * The model's directory (tokenizer.json, chat template; an image-text model's config.json and
   * preprocessor_config.json for image chats): requests are tokenized and hashed as the workers do.
   */
  tokenizer: string | null;
  /** The workers' --chat-template text when they were started with one (the router renders chat requests with it). */
  chatTemplate: string | null;
  /** The workers' other flags that change their prompts (content format, template kwargs, image processing): {} = kiln serve's defaults. */
  workerPrompt: Omit<WorkerPromptSettings, "chatTemplate">;
  healthCheckIntervalMs: number;
  healthCheckTimeoutMs: number;
  healthFailureThreshold: number;
  healthSuccessThreshold: number;
  healthCheckEndpoint: string;
  /** A worker that has not finished its response by then is cut off (504 if nothing was sent yet). */
  requestTimeoutMs: number;
  /** Further workers a request may be sent to after the first could not be reached or was unavailable (502/503/504). */
  maxRetries: number;
  /** Largest request body in bytes (413 above). */
  maxPayloadSize: number;
  /** Requests in flight per worker before it takes no more (429 when every healthy worker is full); 0 = no limit. */
  maxInflightPerWorker: number;
  /** Origins allowed by CORS; empty allows any (vllm-router's --cors-allowed-origins). */
  corsAllowedOrigins: string[];
  /** "debug" logs every routing decision to stderr. */
  logLevel: "debug" | "info" | "warning" | "error" | "critical";
}

/** vllm-router's defaults (its --port 30000, --host 127.0.0.1, --policy cache_aware ...). */
export const DEFAULT_ROUTER_CONFIG: Omit<RouterConfig, "workerUrls"> = {
  host: "127.0.0.1",
  port: 30000,
  policy: "cache_aware",
  pdDisaggregation: false,
  prefillUrls: [],
  decodeUrls: [],
  prefillPolicy: null,
  decodePolicy: null,
  serviceDiscovery: false,
  selector: {},
  prefillSelector: {},
  decodeSelector: {},
  serviceDiscoveryPort: 80,
  serviceDiscoveryNamespace: null,
  bootstrapPortAnnotation: "vllm.ai/bootstrap-port",
  serviceDiscoveryApiUrl: null,
  cacheThreshold: 0.3,
  balanceAbsThreshold: 64,
  balanceRelThreshold: 1.5,
  evictionIntervalMs: 120_000,
  maxTreeSize: 67_108_864,
  prefixCacheScorerWeight: 3,
  queueScorerWeight: 2,
  kvCacheUtilizationScorerWeight: 2,
  precisePrefixCacheScorerWeight: 0,
  kvEventsEndpoint: null,
  kvEventsTopic: "kv-events",
  tokenizer: null,
  chatTemplate: null,
  workerPrompt: {},
  healthCheckIntervalMs: 60_000,
  healthCheckTimeoutMs: 5_000,
  healthFailureThreshold: 3,
  healthSuccessThreshold: 2,
  healthCheckEndpoint: "/health",
  requestTimeoutMs: 1_800_000,
  maxRetries: 5,
  maxPayloadSize: 536_870_912,
  maxInflightPerWorker: 0,
  corsAllowedOrigins: [],
  logLevel: "info",
};

/** The longest delay Node's timers (setTimeout, setInterval, AbortSignal.timeout) keep: longer ones fire after 1 ms. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

export class RouterConfigError extends KilnError {
  override name = "RouterConfigError";
}

/** The policies in use: `policy`, or with P/D the prefill and the decode workers' (each defaulting to `policy`). */
export function policiesInUse(c: RouterConfig): PolicyName[] {
  return c.pdDisaggregation ? [c.prefillPolicy ?? c.policy, c.decodePolicy ?? c.policy] : [c.policy];
}

function normalize(url: string): string {
  try {
    return normalizeWorkerUrl(url);
  } catch (e) {
    throw new RouterConfigError((e as Error).message);
  }
}

// Kubernetes' syntax of label (and annotation) keys, [prefix/]name, and of label values.
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/** Why `key` is not a Kubernetes label or annotation key, or null when it is one. */
export function labelKeyError(key: string): string | null {
  const slash = key.lastIndexOf("/");
  const [prefix, name] = slash < 0 ? [null, key] : [key.slice(0, slash), key.slice(slash + 1)];
  if (prefix !== null && !(prefix.length <= 253 && DNS_SUBDOMAIN.test(prefix))) return `its prefix ${JSON.stringify(prefix)} is not a DNS subdomain`;
  if (!(name.length <= 63 && LABEL_NAME.test(name))) return "its name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit";
  return null;
}

function checkSelector(key: string, flag: string, selector: Record<string, string>): void {
  for (const [k, v] of Object.entries(selector)) {
    const bad = labelKeyError(k);
    if (bad !== null) throw new RouterConfigError(`${key} (${flag}): ${JSON.stringify(k)} is not a label key: ${bad}`);
    if (!(v === "" || (v.length <= 63 && LABEL_NAME.test(v)))) throw new RouterConfigError(`${key} (${flag}): ${JSON.stringify(v)} is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)`);
  }
}

const isEmpty = (selector: Record<string, string>): boolean => Object.keys(selector).length === 0;

/** Where the fleet's workers come from: static URLs, service discovery, or both (checked per role). */
function checkWorkerSources(c: RouterConfig): void {
  const sd = c.serviceDiscovery;
  if (c.pdDisaggregation) {
    if (c.workerUrls.length > 0) throw new RouterConfigError("with P/D disaggregation the workers are given as prefill and decode URLs (--prefill, --decode), not worker URLs");
    if (!sd && (c.prefillUrls.length === 0 || c.decodeUrls.length === 0))
      throw new RouterConfigError(`P/D disaggregation needs at least one prefill and one decode worker URL (--prefill, --decode); got ${c.prefillUrls.length} and ${c.decodeUrls.length}`);
    if (sd && !isEmpty(c.selector)) throw new RouterConfigError("with P/D disaggregation pods are selected by prefillSelector and decodeSelector (--prefill-selector, --decode-selector), not selector");
    for (const [role, urls, selector] of [["prefill", c.prefillUrls, c.prefillSelector], ["decode", c.decodeUrls, c.decodeSelector]] as const)
      if (sd && urls.length === 0 && isEmpty(selector)) throw new RouterConfigError(`P/D disaggregation with service discovery needs ${role} workers: ${role}Selector (--${role}-selector key=value) or ${role} URLs (--${role})`);
  } else {
    if (c.workerUrls.length === 0 && !sd) throw new RouterConfigError("the router needs at least one worker URL (or service discovery)");
    if (c.prefillUrls.length > 0 || c.decodeUrls.length > 0 || c.prefillPolicy !== null || c.decodePolicy !== null || !isEmpty(c.prefillSelector) || !isEmpty(c.decodeSelector))
      throw new RouterConfigError("prefill and decode workers, selectors and policies (--prefill, --decode, --prefill-selector, --decode-selector, --prefill-policy, --decode-policy) need P/D disaggregation (--pd-disaggregation)");
    if (sd && isEmpty(c.selector)) throw new RouterConfigError("service discovery needs the worker pods' labels: selector (--selector key=value ...)");
  }
  if (!sd && (!isEmpty(c.selector) || c.serviceDiscoveryNamespace !== null || c.serviceDiscoveryApiUrl !== null))
    throw new RouterConfigError("selector, serviceDiscoveryNamespace and serviceDiscoveryApiUrl (--selector, --service-discovery-namespace, --service-discovery-api-url) need service discovery (--service-discovery)");
  checkSelector("selector", "--selector", c.selector);
  checkSelector("prefillSelector", "--prefill-selector", c.prefillSelector);
  checkSelector("decodeSelector", "--decode-selector", c.decodeSelector);
  if (c.serviceDiscoveryNamespace !== null && !(c.serviceDiscoveryNamespace.length <= 63 && DNS_LABEL.test(c.serviceDiscoveryNamespace)))
    throw new RouterConfigError(`serviceDiscoveryNamespace (--service-discovery-namespace) must be a namespace name (lower-case letters, digits and '-'), got ${JSON.stringify(c.serviceDiscoveryNamespace)}`);
  const annotation = labelKeyError(c.bootstrapPortAnnotation);
  if (annotation !== null) throw new RouterConfigError(`bootstrapPortAnnotation (--bootstrap-port-annotation) ${JSON.stringify(c.bootstrapPortAnnotation)} is not an annotation key: ${annotation}`);
  if (c.serviceDiscoveryApiUrl !== null && !/^https?:\/\/[^/\s?#]+(\/[^\s?#]*)?$/.test(c.serviceDiscoveryApiUrl))
    throw new RouterConfigError(`serviceDiscoveryApiUrl (--service-discovery-api-url) must be http(s)://host:port, got ${JSON.stringify(c.serviceDiscoveryApiUrl)}`);
}

/** The config with defaults filled in and worker URLs normalized; throws RouterConfigError naming what is wrong. */
export function resolveRouterConfig(partial: Partial<RouterConfig>): RouterConfig {
  const c: RouterConfig = { ...DEFAULT_ROUTER_CONFIG, workerUrls: [], ...partial };
  checkWorkerSources(c);
  const prefillUrls = c.prefillUrls.map(({ url, bootstrapPort }) => {
    if (bootstrapPort !== null && !(Number.isInteger(bootstrapPort) && bootstrapPort >= 0 && bootstrapPort <= 65535))
      throw new RouterConfigError(`prefill worker ${url}: bootstrap port must be an integer in [0, 65535], got ${bootstrapPort}`);
    return { url: normalize(url), bootstrapPort };
  });
  const urls = c.workerUrls.map(normalize);
  const decodeUrls = c.decodeUrls.map(normalize);
  // one pool per URL: a worker is prefill or decode, not both (its load and health are counted once)
  const all = [...urls, ...prefillUrls.map((p) => p.url), ...decodeUrls];
  const dup = all.find((u, i) => all.indexOf(u) !== i);
  if (dup !== undefined) throw new RouterConfigError(`worker URL ${dup} is given twice`);
  for (const [key, name] of [["policy", c.policy], ["prefillPolicy", c.prefillPolicy], ["decodePolicy", c.decodePolicy]] as const)
    if (name !== null && !(POLICY_NAMES as readonly string[]).includes(name)) throw new RouterConfigError(`unknown ${key} ${JSON.stringify(name)}`);
  const range = (key: keyof RouterConfig, lo: number, hi = Infinity, int = false): void => {
    const v = c[key] as number;
    if (typeof v !== "number" || !(v >= lo && v <= hi) || (int && !Number.isInteger(v)))
      throw new RouterConfigError(`${key} must be ${int ? "an integer" : "a number"} in [${lo}, ${hi}], got ${v}`);
  };
  range("port", 0, 65535, true);
  range("serviceDiscoveryPort", 1, 65535, true);
  range("cacheThreshold", 0, 1);
  range("balanceAbsThreshold", 0, Infinity, true);
  range("balanceRelThreshold", 1);
  range("maxTreeSize", 1, Infinity, true);
  for (const key of ["prefixCacheScorerWeight", "queueScorerWeight", "kvCacheUtilizationScorerWeight", "precisePrefixCacheScorerWeight"] as const) range(key, 0);
  if (c.kvEventsEndpoint !== null && !/^(nats|tls):\/\/[^/\s]+$/.test(c.kvEventsEndpoint))
    throw new RouterConfigError(`kvEventsEndpoint (--kv-events-endpoint) must be nats://host:port, got ${JSON.stringify(c.kvEventsEndpoint)}`);
  if (!/^[^\s]+$/.test(c.kvEventsTopic)) throw new RouterConfigError(`kvEventsTopic must be a NATS subject, got ${JSON.stringify(c.kvEventsTopic)}`);
  const precise = policiesInUse(c).find((p) => p === "precise_prefix" || (p === "weighted" && c.precisePrefixCacheScorerWeight > 0));
  if (precise !== undefined && (c.kvEventsEndpoint === null || c.tokenizer === null))
    throw new RouterConfigError(`${precise === "weighted" ? "the precise-prefix-cache scorer" : "policy precise_prefix"} needs the workers' KV-cache events and the model's tokenizer (kvEventsEndpoint and tokenizer: --kv-events-endpoint and --tokenizer)`);
  range("maxRetries", 0, Infinity, true);
  range("maxInflightPerWorker", 0, Infinity, true);
  range("healthFailureThreshold", 1, Infinity, true);
  range("healthSuccessThreshold", 1, Infinity, true);
  range("maxPayloadSize", 1, Infinity, true);
  for (const key of ["evictionIntervalMs", "healthCheckIntervalMs", "healthCheckTimeoutMs", "requestTimeoutMs"] as const) range(key, 1, MAX_TIMER_MS);
  if (!c.healthCheckEndpoint.startsWith("/")) throw new RouterConfigError(`healthCheckEndpoint must be a path such as /health, got ${c.healthCheckEndpoint}`);
  return { ...c, workerUrls: urls, prefillUrls, decodeUrls };
}
