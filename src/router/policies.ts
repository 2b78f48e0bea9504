// Routing policies (vllm-router's --policy): each picks one of the candidate workers (healthy, not yet tried for
// this request, not at capacity) for a request's routing text, and says why. cache_aware and weighted (llm-d's
// scorers) live in their own files.
import { CacheAwarePolicy, type CacheAwareOptions } from "./cache-aware-policy.js";
import type { PolicyName, RoutingDecision, RoutingPolicy, WorkerView } from "./routing-types.js";
import { WeightedPolicy, type WeightedOptions } from "./weighted-policy.js";
import type { KvBlockIndex } from "./kv-block-index.js";
import { PrecisePrefixPolicy } from "./precise-prefix-policy.js";

export { leastLoaded, POLICY_NAMES, type PolicyName, type RoutingDecision, type RoutingPolicy, type RoutingReason, type WorkerView } from "./routing-types.js";

class RoundRobinPolicy implements RoutingPolicy {
  readonly name = "round_robin";
  private next = 0;
  select(candidates: readonly WorkerView[]): RoutingDecision {
    const w = candidates[this.next++ % candidates.length]!;
    return { url: w.url, reason: "round_robin", matchRate: 0 };
  }
  forgetWorker(): void {}
  maintain(): void {}
}

class RandomPolicy implements RoutingPolicy {
  readonly name = "random";
  constructor(private readonly random: () => number) {}
  select(candidates: readonly WorkerView[]): RoutingDecision {
    const w = candidates[Math.floor(this.random() * candidates.length)]!;
    return { url: w.url, reason: "random", matchRate: 0 };
  }
  forgetWorker(): void {}
  maintain(): void {}
}

/** Two distinct random candidates; the less loaded one (the first drawn on a tie). */
class PowerOfTwoPolicy implements RoutingPolicy {
  readonly name = "power_of_two";
  constructor(private readonly random: () => number) {}
  select(candidates: readonly WorkerView[]): RoutingDecision {
    const n = candidates.length;
    const i = Math.floor(this.random() * n);
    let j = n > 1 ? Math.floor(this.random() * (n - 1)) : i;
    if (n > 1 && j >= i) j++;
    const a = candidates[i]!;
    const b = candidates[j]!;
    return { url: (b.load < a.load ? b : a).url, reason: "power_of_two", matchRate: 0 };
  }
  forgetWorker(): void {}
  maintain(): void {}
}

export interface PolicyOptions extends CacheAwareOptions, WeightedOptions {
  /** Uniform [0, 1) source for random and power_of_two (Math.random by default; tests pass a seeded one). */
  random?: () => number;
  /** The KV-block index fed by the workers' KV-cache events: precise_prefix needs it, weighted's precise scorer reads it. */
  kvBlockIndex?: KvBlockIndex | null;
}

/**
 * @example const policy = createPolicy("round_robin", DEFAULT_ROUTER_CONFIG);
 */
export function createPolicy(name: PolicyName, options: PolicyOptions): RoutingPolicy {
  const random = options.random ?? Math.random;
  switch (name) {
    case "cache_aware":
      return new CacheAwarePolicy(options);
    case "round_robin":
      return new RoundRobinPolicy();
    case "random":
      return new RandomPolicy(random);
    case "power_of_two":
      return new PowerOfTwoPolicy(random);
    case "weighted":
      return new WeightedPolicy(options, options.kvBlockIndex ?? null);
    case "precise_prefix":
      if (!options.kvBlockIndex) throw new Error("[router] precise_prefix needs the KV-block index (--kv-events-endpoint)");
      return new PrecisePrefixPolicy(options.kvBlockIndex);
  }
}
