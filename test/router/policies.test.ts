// Routing policies with exact, hand-worked choices (vllm-router's round_robin, random, power_of_two, cache_aware).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { CacheAwarePolicy } from "../../src/router/cache-aware-policy.js";
import { createPolicy, leastLoaded, type WorkerView } from "../../src/router/policies.js";
import { WeightedPolicy } from "../../src/router/weighted-policy.js";

const w = (url: string, load = 0, kvCacheUsage: number | null = null): WorkerView => ({ url, load, kvCacheUsage });
/** A random source that returns the given values in turn. */
const draws = (...values: number[]) => () => {
  const v = values.shift();
  assert.notEqual(v, undefined, "the policy drew more random numbers than expected");
  return v!;
};
const OPTS = {
  cacheThreshold: 0.5, balanceAbsThreshold: 2, balanceRelThreshold: 1.5, maxTreeSize: 1000,
  prefixCacheScorerWeight: 3, queueScorerWeight: 2, kvCacheUtilizationScorerWeight: 2,
};

describe("load-only policies", () => {
  it("leastLoaded: lowest load, then lowest KV-cache usage, then the tie-break, then the first", () => {
    assert.equal(leastLoaded([w("a", 2), w("b", 1), w("c", 1)]).url, "b");
    assert.equal(leastLoaded([w("a", 2), w("b", 1, 0.5), w("c", 1, 0.2)]).url, "c");
    assert.equal(leastLoaded([w("a", 1), w("b", 1)], (x) => (x.url === "a" ? 10 : 3)).url, "b");
    assert.equal(leastLoaded([w("a"), w("b")]).url, "a");
  });

  it("round_robin cycles through the candidates", () => {
    const p = createPolicy("round_robin", OPTS);
    const ws = [w("a"), w("b"), w("c")];
    assert.deepEqual([1, 2, 3, 4].map(() => p.select(ws, "x").url), ["a", "b", "c", "a"]);
    assert.equal(p.select(ws, "").reason, "round_robin");
  });

  it("random picks floor(r * n)", () => {
    const p = createPolicy("random", { ...OPTS, random: draws(0.5, 0.99, 0) });
    const ws = [w("a"), w("b"), w("c")];
    assert.deepEqual([1, 2, 3].map(() => p.select(ws, "").url), ["b", "c", "a"]);
  });

  it("power_of_two draws two distinct candidates and keeps the less loaded (the first on a tie)", () => {
    const ws = [w("a", 5), w("b", 0), w("c", 1)];
    // i = floor(0.1 * 3) = 0 (a); j = floor(0.9 * 2) = 1 -> >= i -> 2 (c): c is less loaded
    assert.equal(createPolicy("power_of_two", { ...OPTS, random: draws(0.1, 0.9) }).select(ws, "").url, "c");
    // i = floor(0.5 * 3) = 1 (b); j = floor(0.2 * 2) = 0 (a): b is less loaded
    assert.equal(createPolicy("power_of_two", { ...OPTS, random: draws(0.5, 0.2) }).select(ws, "").url, "b");
    // tie: the first drawn (c before a)
    const tie = [w("a", 1), w("b", 0), w("c", 1)];
    assert.equal(createPolicy("power_of_two", { ...OPTS, random: draws(0.9, 0.1) }).select(tie, "").url, "c");
    assert.equal(createPolicy("power_of_two", { ...OPTS, random: draws(0.4) }).select([w("only")], "").url, "only");
  });
});

describe("cache_aware", () => {
  const Q1 = "system: be brief. Q1"; // 20 characters
  const Q2 = "system: be brief. Q2"; // shares 19 with Q1
  const OTHER = "another topic entirely";

  it("sends a shared prefix to the worker that saw it; a miss goes to the least loaded, then the smallest tree", () => {
    const p = new CacheAwarePolicy(OPTS);
    const idle = [w("w0"), w("w1")];
    assert.deepEqual(p.select(idle, Q1), { url: "w0", reason: "cache_miss", matchRate: 0 }); // tie: first
    assert.deepEqual(p.select(idle, OTHER), { url: "w1", reason: "cache_miss", matchRate: 0 }); // w1's tree is empty
    assert.deepEqual(p.select(idle, Q2), { url: "w0", reason: "cache_hit", matchRate: 19 / 20 });
    assert.deepEqual(p.select(idle, `${OTHER}, continued`), { url: "w1", reason: "cache_hit", matchRate: 22 / 33 });
    assert.equal(p.tree.size("w0"), 21); // "system: be brief. Q" + "1" + "2"
    // a match at or under the threshold is a miss: "s" of 2 characters is exactly 0.5
    assert.equal(p.select(idle, "sx").reason, "cache_miss");
  });

  it("an imbalanced fleet goes to the least loaded worker, even against a prefix match", () => {
    const p = new CacheAwarePolicy(OPTS);
    p.select([w("w0"), w("w1")], Q1); // -> w0
    // 5 - 1 = 4 > 2 and 5 > 1 * 1.5: imbalanced
    assert.deepEqual(p.select([w("w0", 5), w("w1", 1)], Q2), { url: "w1", reason: "load_balanced", matchRate: 0 });
    // the choice is recorded: w1 now holds Q2 too
    assert.deepEqual(p.tree.match(Q2), { matchedChars: 20, tenants: ["w1"] });
    // 2 - 0 = 2 is not over 2: balanced, and the prefix wins over the load
    assert.deepEqual(p.select([w("w0", 2), w("w1", 0)], `${Q1}!`), { url: "w0", reason: "cache_hit", matchRate: 20 / 21 });
    // 3 - 0 > 2 but 3 > 0 * 1.5 too: imbalanced (the relative test passes trivially against an idle worker)
    assert.equal(p.select([w("w0", 3), w("w1", 0)], `${Q1}!`).reason, "load_balanced");
  });

  it("among workers holding the match, the least loaded; only candidates count", () => {
    const p = new CacheAwarePolicy(OPTS);
    p.select([w("w0"), w("w1"), w("w2")], Q1); // -> w0
    p.select([w("w1")], Q1); // -> w1 (the only candidate): a hit on w1 is not possible, w0 is not a candidate
    assert.deepEqual(p.tree.match(Q1).tenants, ["w0", "w1"]);
    assert.deepEqual(p.select([w("w0", 1), w("w1", 0), w("w2", 0)], Q2), { url: "w1", reason: "cache_hit", matchRate: 19 / 20 });
    // w0 and w1 excluded (e.g. tried already): no match on w2
    assert.deepEqual(p.select([w("w2")], Q2), { url: "w2", reason: "cache_miss", matchRate: 0 });
  });

  it("an empty text routes by load and records nothing", () => {
    const p = new CacheAwarePolicy(OPTS);
    assert.deepEqual(p.select([w("w0", 1), w("w1", 0)], ""), { url: "w1", reason: "cache_miss", matchRate: 0 });
    assert.equal(p.tree.size("w1"), 0);
  });

  it("forgetWorker drops a worker's prefixes; maintain() evicts to max-tree-size", () => {
    const p = new CacheAwarePolicy({ ...OPTS, maxTreeSize: 9 });
    p.select([w("w0"), w("w1")], Q1); // w0, 20 characters > 2 * 9: trimmed at once
    assert.equal(p.tree.size("w0"), 0); // one leaf of 20 characters: all of it goes
    const q = new CacheAwarePolicy(OPTS);
    q.select([w("w0"), w("w1")], Q1);
    q.forgetWorker("w0");
    assert.equal(q.select([w("w0"), w("w1")], Q2).reason, "cache_miss");
    const r = new CacheAwarePolicy({ ...OPTS, maxTreeSize: 15 });
    r.select([w("w0")], "0123456789"); // 10 <= 2 * 15: kept
    r.select([w("w0")], "abcdefghij"); // 20 <= 30: kept until maintain()
    assert.equal(r.tree.size("w0"), 20);
    r.maintain();
    assert.equal(r.tree.size("w0"), 10);
    assert.equal(r.tree.match("abcdefghij").matchedChars, 10); // the newer text survives
  });
});

describe("weighted (llm-d's scorers)", () => {
  it("scores prefix, queue and KV-cache per worker and picks the highest weighted total", () => {
    const p = new WeightedPolicy(OPTS);
    p.tree.insert("abcdefgh", "w0"); // 8 of "abcdefghij": 0.8
    p.tree.insert("abcd", "w2"); // 0.4
    const ws = [w("w0", 4, 0.5), w("w1", 0, 0.1), w("w2", 2, null)];
    // queue: max 4, min 0 -> w0 0, w1 1, w2 0.5; kv: 0.5, 0.9, 1 (unknown counts as empty)
    // totals (3, 2, 2): w0 2.4 + 0 + 1 = 3.4; w1 0 + 2 + 1.8 = 3.8; w2 1.2 + 1 + 2 = 4.2
    const scores = p.score(ws, "abcdefghij");
    assert.deepEqual(scores.map((s) => [s.prefix, s.queue, s.kvCache]), [[0.8, 0, 0.5], [0, 1, 0.9], [0.4, 0.5, 1]]);
    assert.deepEqual(scores.map((s) => Math.round(s.total * 1e9) / 1e9), [3.4, 3.8, 4.2]);
    assert.deepEqual(p.select(ws, "abcdefghij"), { url: "w2", reason: "weighted", matchRate: 0.4 });
    // w2 now holds all 10: prefix 1 -> 3 + 1 + 2 = 6 beats w0's 3 * 0.8 + 1 = 3.4 and w1's 3.8
    assert.equal(p.select(ws, "abcdefghij").url, "w2");
    // a heavy prefix weight on a fresh tree: w0 = 10 * 0.8 + 0 + 1 = 9, w1 = 3.8, w2 = 10 * 0.4 + 1 + 2 = 7
    const heavy = new WeightedPolicy({ ...OPTS, prefixCacheScorerWeight: 10 });
    heavy.tree.insert("abcdefgh", "w0");
    heavy.tree.insert("abcd", "w2");
    assert.equal(heavy.select(ws, "abcdefghij").url, "w0");
  });

  it("ties go to the least loaded, then the first; an empty text scores load and KV cache only", () => {
    const p = new WeightedPolicy({ ...OPTS, queueScorerWeight: 0, kvCacheUtilizationScorerWeight: 0 });
    assert.equal(p.select([w("a", 3), w("b", 1), w("c", 1)], "").url, "b");
    const q = new WeightedPolicy(OPTS);
    assert.equal(q.select([w("a", 0, 0.7), w("b", 0, 0.2)], "").url, "b");
    assert.equal(q.tree.size("b"), 0);
  });
});
