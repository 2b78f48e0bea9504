// `kiln router`'s P/D disaggregation flags, as vllm-router names them: --pd-disaggregation (or --vllm-pd-disaggregation),
// --prefill <url> [bootstrap_port] and --decode <url> repeated or listed, --prefill-policy, --decode-policy.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Command } from "commander";
import { parseRouterArgs, registerRouterCommand } from "../../src/cli/router-command.js";
import { CliUsageError } from "../../src/cli/usage-error.js";
import { DEFAULT_ROUTER_CONFIG } from "../../src/router/router-config.js";

/** The router command's config for `args`, as commander parses them (no action run). */
function parse(...args: string[]) {
  const program = new Command().exitOverride();
  registerRouterCommand(program);
  const cmd = program.commands.find((c) => c.name() === "router")!;
  cmd.exitOverride().configureOutput({ writeErr: () => {} }).action(() => {});
  program.parse(["node", "kiln", "router", ...args]);
  return parseRouterArgs(cmd.opts());
}

describe("kiln router P/D flags", () => {
  it("--prefill takes a URL and an optional bootstrap port, repeated or listed; --decode likewise; --worker-urls is not needed", () => {
    const c = parse(
      "--pd-disaggregation", "--prefill", "http://p1:8100", "9000", "--prefill", "http://p2:8100/", "none", "http://p3:8100",
      "--decode", "http://d1:8200", "--decode", "http://d2:8200,http://d3:8200", "--prefill-policy", "cache_aware", "--decode-policy", "power_of_two",
    );
    assert.deepEqual(c, {
      ...DEFAULT_ROUTER_CONFIG, workerUrls: [], pdDisaggregation: true,
      prefillUrls: [{ url: "http://p1:8100", bootstrapPort: 9000 }, { url: "http://p2:8100", bootstrapPort: null }, { url: "http://p3:8100", bootstrapPort: null }],
      decodeUrls: ["http://d1:8200", "http://d2:8200", "http://d3:8200"], prefillPolicy: "cache_aware", decodePolicy: "power_of_two",
    });
    const v = parse("--vllm-pd-disaggregation", "--policy", "round_robin", "--prefill", "http://p:1", "--decode", "http://d:2");
    assert.equal(v.pdDisaggregation, true);
    assert.equal(v.policy, "round_robin");
    assert.deepEqual([v.prefillPolicy, v.decodePolicy], [null, null]); // both follow --policy
  });

  it("bad P/D flags are usage errors naming the flag", () => {
    const cases: [string[], RegExp][] = [
      [["--pd-disaggregation", "--prefill", "http://p:1"], /needs at least one --prefill and one --decode/],
      [["--pd-disaggregation", "--decode", "http://d:1"], /needs at least one --prefill and one --decode/],
      [["--pd-disaggregation", "--worker-urls", "http://w:1", "--prefill", "http://p:1", "--decode", "http://d:1"], /not --worker-urls/],
      [["--worker-urls", "http://w:1", "--prefill", "http://p:1"], /need --pd-disaggregation/],
      [["--worker-urls", "http://w:1", "--decode-policy", "random"], /need --pd-disaggregation/],
      [["--pd-disaggregation", "--prefill", "9000", "http://p:1", "--decode", "http://d:1"], /--prefill: 9000 must follow a URL/],
      [["--pd-disaggregation", "--prefill", "http://p:1", "9000", "9001", "--decode", "http://d:1"], /--prefill: 9001 must follow a URL/],
      [["--pd-disaggregation", "--prefill", "http://p:1", "70000", "--decode", "http://d:1"], /bootstrap port must be an integer in \[0, 65535\]/],
      [["--pd-disaggregation", "--prefill", "http://x:1", "--decode", "http://x:1/"], /http:\/\/x:1 is given twice/],
      [["--pd-disaggregation", "--prefill", "http://p:1/v1", "--decode", "http://d:1"], /ends in \/v1/],
      [["--pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://d:1", "--prefill-policy", "precise_prefix"], /policy precise_prefix needs/],
      [[], /--worker-urls needs at least one URL/],
    ];
    for (const [args, message] of cases)
      assert.throws(() => parse(...args), (e: unknown) => e instanceof CliUsageError && message.test((e as Error).message), args.join(" "));
    assert.throws(() => parse("--pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://d:1", "--decode-policy", "fastest"), /Allowed choices are/);
  });
});
