// The cache_aware policy's approximate prefix tree: matches, per-worker sizes and LRU eviction, worked by hand.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { PrefixTree } from "../../src/router/prefix-tree.js";

describe("PrefixTree", () => {
  it("finds the longest prefix any worker was sent, and which workers hold all of it", () => {
    const t = new PrefixTree();
    t.insert("hello world", "w0");
    t.insert("help me", "w1");
    // root -> "hel" {w0, w1} -> "lo world" {w0} | "p me" {w1}
    assert.equal(t.nodeCount(), 3);
    assert.deepEqual(t.match("hello there"), { matchedChars: 6, tenants: ["w0"] }); // "hello " (ends inside an edge)
    assert.deepEqual(t.match("help you"), { matchedChars: 5, tenants: ["w1"] }); // "help "
    assert.deepEqual(t.match("hex"), { matchedChars: 2, tenants: ["w0", "w1"] });
    assert.deepEqual(t.match("hello world, again"), { matchedChars: 11, tenants: ["w0"] });
    assert.deepEqual(t.match("xyz"), { matchedChars: 0, tenants: [] });
    assert.deepEqual(t.match(""), { matchedChars: 0, tenants: [] });
    assert.equal(t.size("w0"), 11);
    assert.equal(t.size("w1"), 7); // "hel" + "p me"
    assert.equal(t.size("nobody"), 0);
  });

  it("matchEach gives every worker its own longest shared prefix", () => {
    const t = new PrefixTree();
    t.insert("hello world", "w0");
    t.insert("help me", "w1");
    t.insert("hello", "w2");
    assert.deepEqual(Object.fromEntries(t.matchEach("hello there")), { w0: 6, w1: 3, w2: 5 });
    assert.deepEqual(Object.fromEntries(t.matchEach("hex")), { w0: 2, w1: 2, w2: 2 });
    assert.equal(t.matchEach("zzz").size, 0);
  });

  it("a prefix only an excluded worker holds does not count", () => {
    const t = new PrefixTree();
    t.insert("hello world", "w0");
    t.insert("help me", "w1");
    assert.deepEqual(t.match("hello there", (w) => w !== "w0"), { matchedChars: 3, tenants: ["w1"] });
    assert.deepEqual(t.match("hello there", (w) => w === "w2"), { matchedChars: 0, tenants: [] });
  });

  it("splitting an edge keeps every worker's size", () => {
    const t = new PrefixTree();
    t.insert("abcdef", "a");
    t.insert("abcxyz", "a");
    assert.equal(t.size("a"), 9); // "abc" + "def" + "xyz"
    t.insert("abcdef", "b");
    assert.equal(t.size("b"), 6);
    assert.equal(t.size("a"), 9);
    assert.deepEqual(t.match("abcdeZ"), { matchedChars: 5, tenants: ["a", "b"] });
  });

  it("evicts each worker's least recently used leaves until it fits, and unlinks nodes nobody holds", () => {
    const t = new PrefixTree();
    t.insert("aaaa", "w");
    t.insert("bbbb", "w");
    t.insert("cccc", "w");
    t.insert("aaaa", "w"); // touched again: now "bbbb" is the oldest
    assert.equal(t.evict(8), 4);
    assert.equal(t.size("w"), 8);
    assert.equal(t.match("bbbb").matchedChars, 0);
    assert.equal(t.match("aaaa").matchedChars, 4);
    assert.equal(t.match("cccc").matchedChars, 4);
    assert.equal(t.nodeCount(), 2);
    assert.equal(t.evict(8), 0); // already fits
  });

  it("an inner node becomes evictable once its children are gone", () => {
    const t = new PrefixTree();
    t.insert("abcX", "w"); // time 1
    t.insert("abcY", "w"); // time 2: "abc" -> "X" (1) | "Y" (2)
    assert.equal(t.size("w"), 5);
    assert.equal(t.evict(3), 2); // X, then Y; "abc" (3 chars) fits
    assert.equal(t.nodeCount(), 1);
    assert.deepEqual(t.match("abcX"), { matchedChars: 3, tenants: ["w"] });
    assert.equal(t.evict(0), 3);
    assert.equal(t.nodeCount(), 0);
    assert.equal(t.size("w"), 0);
  });

  it("eviction trims only the workers over the limit and keeps nodes others hold", () => {
    const t = new PrefixTree();
    t.insert("abcdef", "t1");
    t.insert("ab", "t2"); // "ab" {t1, t2} -> "cdef" {t1}
    assert.equal(t.evict(3), 4);
    assert.equal(t.size("t1"), 2);
    assert.equal(t.size("t2"), 2);
    assert.deepEqual(t.match("abcdef"), { matchedChars: 2, tenants: ["t1", "t2"] });
    t.insert("abzz", "t2");
    assert.equal(t.evict(3, "t1"), 0); // only t1 is considered, and it fits
    assert.equal(t.size("t2"), 4);
  });

  it("removeTenant forgets one worker and unlinks what only it held", () => {
    const t = new PrefixTree();
    t.insert("hello", "w0");
    t.insert("hello", "w1");
    t.insert("help", "w1");
    t.removeTenant("w1");
    assert.deepEqual(t.match("help"), { matchedChars: 3, tenants: ["w0"] });
    assert.equal(t.size("w1"), 0);
    assert.deepEqual(t.tenants(), ["w0"]);
    assert.equal(t.nodeCount(), 2); // "hel" -> "lo"
  });

  it("stays bounded under a stream of distinct texts (eviction at the limit)", () => {
    const t = new PrefixTree();
    for (let i = 0; i < 2000; i++) {
      t.insert(`prompt number ${i} with some shared words`, "w");
      t.evict(1000);
      assert.ok(t.size("w") <= 1000);
    }
    // the most recent texts survive, the oldest are gone
    assert.equal(t.match("prompt number 1999 with some shared words").matchedChars, 41);
    assert.ok(t.match("prompt number 5 with some shared words").matchedChars < 20);
  });
});
