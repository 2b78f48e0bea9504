// `kiln router`'s flags: vllm-router's names and defaults parsed into RouterConfig, and clear usage errors.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { parseRouterArgs, registerRouterCommand } from "../../src/cli/router-command.js";
import { CliUsageError } from "../../src/cli/usage-error.js";
import { DEFAULT_ROUTER_CONFIG } from "../../src/router/router-config.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root
const kiln = (...args: string[]) => spawnSync(process.execPath, [`${root}/bin/kiln`, ...args], { encoding: "utf8", timeout: 10_000 });

/** The router command's raw option values for `args`, as commander parses them (no action run). */
function rawOptions(args: string[]): Record<string, unknown> {
  const program = new Command().exitOverride();
  registerRouterCommand(program);
  const cmd = program.commands.find((c) => c.name() === "router")!;
  cmd.exitOverride().action(() => {});
  program.parse(["node", "kiln", "router", ...args]);
  return cmd.opts();
}
const parse = (...args: string[]) => parseRouterArgs(rawOptions(args));

describe("kiln router flags", () => {
  it("defaults are vllm-router's", () => {
    const c = parse("--worker-urls", "http://127.0.0.1:8001/", "http://127.0.0.1:8002");
    assert.deepEqual(c, { ...DEFAULT_ROUTER_CONFIG, workerUrls: ["http://127.0.0.1:8001", "http://127.0.0.1:8002"] });
    assert.equal(c.policy, "cache_aware");
    assert.equal(c.cacheThreshold, 0.3);
    assert.equal(c.balanceAbsThreshold, 64);
    assert.equal(c.balanceRelThreshold, 1.5);
    assert.equal(c.port, 30000);
    assert.equal(c.healthCheckIntervalMs, 60_000);
    assert.equal(c.requestTimeoutMs, 1_800_000);
    assert.equal(c.maxRetries, 5);
  });

  it("every flag reaches the config", () => {
    const c = parse(
      "--worker-urls", "http://a:1,http://b:2", "--host", "0.0.0.0", "--port", "0", "--policy", "power_of_two",
      "--cache-threshold", "0.5", "--balance-abs-threshold", "8", "--balance-rel-threshold", "1.1", "--eviction-interval", "30",
      "--max-tree-size", "1000", "--health-check-interval-secs", "0.5", "--health-check-timeout-secs", "2", "--health-failure-threshold", "1",
      "--health-success-threshold", "1", "--health-check-endpoint", "/ping", "--request-timeout-secs", "10", "--retry-max-retries", "2",
      "--max-payload-size", "1024", "--max-inflight-per-worker", "4", "--log-level", "debug",
      "--prefix-cache-scorer-weight", "5", "--queue-scorer-weight", "1", "--kv-cache-utilization-scorer-weight", "0",
      "--precise-prefix-cache-scorer-weight", "2", "--kv-events-endpoint", "nats://10.0.0.5:4222", "--kv-events-topic", "kv.fleet",
      "--tokenizer", "/models/m", "--chat-template", "{{ messages[0].content }}", "--cors-allowed-origins", "https://a.example", "https://b.example",
      "--service-discovery", "--selector", "app=kiln", "tier=serve", "--service-discovery-port", "8000", "--service-discovery-namespace", "serving",
      "--bootstrap-port-annotation", "example.com/kv-port", "--service-discovery-api-url", "http://127.0.0.1:8001",
    );
    assert.deepEqual(c, {
      workerUrls: ["http://a:1", "http://b:2"], host: "0.0.0.0", port: 0, policy: "power_of_two", cacheThreshold: 0.5, balanceAbsThreshold: 8,
      pdDisaggregation: false, prefillUrls: [], decodeUrls: [], prefillPolicy: null, decodePolicy: null, // P/D: test/router/pd-args.test.ts
      serviceDiscovery: true, selector: { app: "kiln", tier: "serve" }, prefillSelector: {}, decodeSelector: {}, serviceDiscoveryPort: 8000,
      serviceDiscoveryNamespace: "serving", bootstrapPortAnnotation: "example.com/kv-port", serviceDiscoveryApiUrl: "http://127.0.0.1:8001",
      balanceRelThreshold: 1.1, evictionIntervalMs: 30_000, maxTreeSize: 1000, healthCheckIntervalMs: 500, healthCheckTimeoutMs: 2000,
      healthFailureThreshold: 1, healthSuccessThreshold: 1, healthCheckEndpoint: "/ping", requestTimeoutMs: 10_000, maxRetries: 2,
      maxPayloadSize: 1024, maxInflightPerWorker: 4, logLevel: "debug",
      prefixCacheScorerWeight: 5, queueScorerWeight: 1, kvCacheUtilizationScorerWeight: 0,
      precisePrefixCacheScorerWeight: 2, kvEventsEndpoint: "nats://10.0.0.5:4222", kvEventsTopic: "kv.fleet", tokenizer: "/models/m",
      chatTemplate: "{{ messages[0].content }}", workerPrompt: {},
      corsAllowedOrigins: ["https://a.example", "https://b.example"],
    });
    assert.equal(parse("--worker-urls", "http://a:1", "--max-retries", "3", "--disable-retries").maxRetries, 0);
  });

  it("bad values are usage errors naming the flag", () => {
    const cases: [string[], RegExp][] = [
      [["--cache-threshold", "1.5"], /--cache-threshold must be a number in \[0, 1\], got "1.5"/],
      [["--balance-abs-threshold", "-1"], /--balance-abs-threshold must be an integer >= 0/],
      [["--balance-rel-threshold", "0.5"], /--balance-rel-threshold must be a number >= 1/],
      [["--port", "70000"], /--port must be an integer in \[0, 65535\]/],
      [["--health-check-interval-secs", "0"], /--health-check-interval-secs must be a number in \(0, 2147483\]/],
      [["--request-timeout-secs", "soon"], /--request-timeout-secs must be a number in \(0, 2147483\], got "soon"/],
      // past Node's longest timer (2^31 - 1 ms) a timeout would fire after 1 ms: every request a 504
      [["--request-timeout-secs", "3000000"], /--request-timeout-secs must be a number in \(0, 2147483\], got "3000000"/],
      [["--health-check-interval-secs", "99999999"], /--health-check-interval-secs must be a number in \(0, 2147483\]/],
      [["--max-retries", "1.5"], /--max-retries must be an integer/],
      [["--max-retries", "1", "--retry-max-retries", "2"], /disagree/],
      [["--health-check-endpoint", "health"], /--health-check-endpoint must be a path/],
      [["--queue-scorer-weight", "-2"], /--queue-scorer-weight must be a number >= 0/],
      [["--policy", "precise_prefix", "--tokenizer", "/m"], /policy precise_prefix needs the workers' KV-cache events and the model's tokenizer/],
      [["--policy", "precise_prefix", "--kv-events-endpoint", "nats://h:1"], /needs the workers' KV-cache events and the model's tokenizer/],
      [["--policy", "weighted", "--precise-prefix-cache-scorer-weight", "1"], /the precise-prefix-cache scorer needs/],
      [["--chat-template", "/no/such/file.jinja"], /--chat-template "\/no\/such\/file.jinja" looks like a file path/],
      [["--kv-events-endpoint", "http://h:1"], /--kv-events-endpoint\) must be nats:\/\/host:port/],
    ];
    for (const [args, message] of cases) {
      assert.throws(() => parse("--worker-urls", "http://a:1", ...args), (e: unknown) => e instanceof CliUsageError && message.test((e as Error).message), args.join(" "));
    }
    assert.throws(() => parse("--worker-urls", "localhost:8000"), /must be http:\/\/ or https:\/\//);
    // the router adds /v1/...: a base ending in /v1 would send /v1/v1/... (a prefix before it is a worker's --root-path)
    assert.throws(() => parse("--worker-urls", "http://127.0.0.1:8000/v1"), /ends in \/v1: give the server's base URL \(e\.g\. http:\/\/127\.0\.0\.1:8000\)/);
    assert.deepEqual(parse("--worker-urls", "http://127.0.0.1:8000/kiln/").workerUrls, ["http://127.0.0.1:8000/kiln"]);
    assert.throws(() => parse("--worker-urls", "http://a:1", "http://a:1/"), /given twice/);
  });

  it("service discovery: vllm-router's flags and defaults; workers optional; selectors checked", () => {
    const sd = parse("--service-discovery", "--selector", "app=kiln,component=serve");
    assert.deepEqual(sd, { ...DEFAULT_ROUTER_CONFIG, workerUrls: [], serviceDiscovery: true, selector: { app: "kiln", component: "serve" } });
    assert.equal(sd.serviceDiscoveryPort, 80); // vllm-router's default
    assert.equal(sd.serviceDiscoveryNamespace, null); // every namespace
    assert.equal(sd.bootstrapPortAnnotation, "vllm.ai/bootstrap-port");
    assert.deepEqual(parse("--service-discovery", "--selector", "app=kiln", "--worker-urls", "http://a:1").workerUrls, ["http://a:1"]); // static + discovered
    const pd = parse("--pd-disaggregation", "--service-discovery", "--prefill-selector", "app=kiln", "component=prefill", "--decode-selector", "component=decode");
    assert.deepEqual([pd.prefillSelector, pd.decodeSelector, pd.prefillUrls, pd.decodeUrls], [{ app: "kiln", component: "prefill" }, { component: "decode" }, [], []]);
    // a static decode worker with discovered prefill pods
    assert.deepEqual(parse("--pd-disaggregation", "--service-discovery", "--prefill-selector", "c=p", "--decode", "http://d:1").decodeUrls, ["http://d:1"]);
    const cases: [string[], RegExp][] = [
      [["--service-discovery"], /--service-discovery needs --selector key=value/],
      [["--selector", "app=kiln"], /need --service-discovery/],
      [["--worker-urls", "http://a:1", "--service-discovery-namespace", "x"], /need --service-discovery/],
      [["--service-discovery", "--selector", "app"], /--selector takes key=value labels, e.g. --selector app=kiln; got "app"/],
      [["--service-discovery", "--selector", "app=a", "app=b"], /--selector gives label app twice \(a and b\)/],
      [["--service-discovery", "--selector", "app=not ok"], /"not ok" is not a label value/],
      [["--service-discovery", "--selector", "-x=1"], /"-x" is not a label key/],
      [["--service-discovery", "--selector", "app=kiln", "--service-discovery-port", "0"], /--service-discovery-port must be an integer in \[1, 65535\]/],
      [["--service-discovery", "--selector", "app=kiln", "--service-discovery-namespace", "Prod"], /must be a namespace name/],
      [["--service-discovery", "--selector", "app=kiln", "--bootstrap-port-annotation", "a/b/"], /is not an annotation key/],
      [["--service-discovery", "--selector", "app=kiln", "--service-discovery-api-url", "127.0.0.1:8001"], /must be http\(s\):\/\/host:port/],
      [["--service-discovery", "--selector", "app=kiln", "--prefill-selector", "c=p"], /need --pd-disaggregation/],
      [["--pd-disaggregation", "--service-discovery", "--prefill-selector", "c=p"], /needs --decode-selector key=value \(or --decode URLs\)/],
      [["--pd-disaggregation", "--service-discovery", "--selector", "app=kiln", "--prefill-selector", "c=p", "--decode-selector", "c=d"], /not --selector/],
    ];
    for (const [args, message] of cases)
      assert.throws(() => parse(...args), (e: unknown) => e instanceof CliUsageError && message.test((e as Error).message), args.join(" "));
  });

  it("--service-discovery outside a pod without --service-discovery-api-url fails at start, saying what to give", () => {
    const env = { ...process.env };
    delete env.KUBERNETES_SERVICE_HOST;
    delete env.KUBERNETES_SERVICE_PORT;
    const r = spawnSync(process.execPath, [`${root}/bin/kiln`, "router", "--service-discovery", "--selector", "app=kiln", "--port", "0"], { encoding: "utf8", timeout: 10_000, env });
    assert.equal(r.status, 1);
    assert.match(r.stderr, /kiln: error: service discovery needs the Kubernetes API: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set \(not in a pod\); give --service-discovery-api-url/);
  });

  it("the command refuses unknown flags, bad choices and missing workers before starting", () => {
    const unknown = kiln("router", "--worker-urls", "http://127.0.0.1:1", "--bogus-flag");
    assert.notEqual(unknown.status, 0);
    assert.match(unknown.stderr, /unknown option '--bogus-flag'/);
    const policy = kiln("router", "--worker-urls", "http://127.0.0.1:1", "--policy", "least_loaded");
    assert.notEqual(policy.status, 0);
    assert.match(policy.stderr, /Allowed choices are cache_aware, round_robin, random, power_of_two, weighted/);
    const missing = kiln("router");
    assert.notEqual(missing.status, 0);
    assert.match(missing.stderr, /--worker-urls/);
    const bad = kiln("router", "--worker-urls", "http://127.0.0.1:1", "--cache-threshold", "2");
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /kiln: error: --cache-threshold must be a number in \[0, 1\]/);
  });

  it("the workers' prompt flags, read as kiln serve reads them (precise routing renders and hashes prompts with them)", () => {
    assert.deepEqual(parse("--worker-urls", "http://127.0.0.1:8001").workerPrompt, {});
    const c = parse("--worker-urls", "http://127.0.0.1:8001", "--chat-template-content-format", "string", "--default-chat-template-kwargs", '{"a": 1}',
      "--mm-processor-kwargs", '{"do_pan_and_scan": true}', "--media-io-kwargs", '{"image": {"rgba_background_color": [0, 0, 0]}}', "--interleave-mm-strings");
    assert.deepEqual(c.workerPrompt, {
      contentFormat: "string", defaultChatTemplateKwargs: { a: 1 }, mmProcessorKwargs: { do_pan_and_scan: true }, rgbaBackground: [0, 0, 0], interleaveMmStrings: true,
    });
    assert.throws(() => parse("--worker-urls", "http://127.0.0.1:8001", "--mm-processor-kwargs", '{"bogus": 1}'), /--mm-processor-kwargs: .*bogus/);
    assert.throws(() => parse("--worker-urls", "http://127.0.0.1:8001", "--default-chat-template-kwargs", "[1]"), /--default-chat-template-kwargs must be a JSON object/);
  });
});
