// The cache_aware policy's approximate prefix tree: one radix tree over request texts shared by every worker
// ("tenant"), each node remembering which workers saw it and when (a logical clock, so tests are exact). It mirrors
// no worker's real KV cache (the router never sees token ids or evictions); it records what each worker was sent,
// which is what its prefix cache most likely holds. Memory is bounded per worker by evicting its least recently
// used leaves (sglang / vllm-router's "approximate tree", max-tree-size in characters).

interface Node {
  /** The characters on the edge from the parent to this node (empty only at the root). */
  edge: string;
  /** Children keyed by the first character of their edge. */
  children: Map<string, Node>;
  parent: Node | null;
  /** Worker -> logical time it last inserted a text through this node. Invariant: a child's workers ⊆ its parent's. */
  tenants: Map<string, number>;
}

/** The longest prefix of a text that some eligible worker was sent, and the workers that were sent all of it. */
export interface PrefixMatch {
  /** Matched characters (UTF-16 code units), 0 when no eligible worker shares even the first one. */
  matchedChars: number;
  /** The eligible workers holding the whole matched prefix, in insertion order of the deepest node (empty when 0). */
  tenants: string[];
}

function newNode(edge: string, parent: Node | null, tenants: Map<string, number> = new Map()): Node {
  return { edge, children: new Map(), parent, tenants };
}

/** Length of the common prefix of `edge` and `text` from `offset`. */
function commonLength(edge: string, text: string, offset: number): number {
  const n = Math.min(edge.length, text.length - offset);
  let i = 0;
  while (i < n && edge.charCodeAt(i) === text.charCodeAt(offset + i)) i++;
  return i;
}

/**
 * A multi-tenant radix tree over strings.
 * @example
 * const tree = new PrefixTree();
 * tree.insert("You are a helpful assistant. Hi", "http://w0");
 * tree.match("You are a helpful assistant. Bye"); // {matchedChars: 29, tenants: ["http://w0"]}
 */
export class PrefixTree {
  private readonly root: Node = newNode("", null);
  private clock = 0;
  /** Characters held per worker (sum of the edge lengths of the nodes it is on). */
  private readonly sizes = new Map<string, number>();

  /** Records that `tenant` was sent `text`: every node on its path gets the tenant at a fresh time. */
  insert(text: string, tenant: string): void {
    const now = ++this.clock;
    if (!this.sizes.has(tenant)) this.sizes.set(tenant, 0);
    let node = this.root;
    let i = 0;
    while (i < text.length) {
      let child = node.children.get(text[i]!);
      if (child === undefined) {
        child = newNode(text.slice(i), node);
        node.children.set(text[i]!, child);
      } else {
        const common = commonLength(child.edge, text, i);
        if (common < child.edge.length) this.split(child, common);
      }
      if (!child.tenants.has(tenant)) this.sizes.set(tenant, this.sizes.get(tenant)! + child.edge.length);
      child.tenants.set(tenant, now);
      i += child.edge.length;
      node = child;
    }
  }

  /**
   * The longest prefix of `text` held by a worker that `eligible` accepts (all workers when absent). The walk stops
   * where no eligible worker continues, so a prefix that only an excluded worker holds does not count.
   */
  match(text: string, eligible?: (tenant: string) => boolean): PrefixMatch {
    const ok = eligible ?? (() => true);
    const holds = (n: Node): boolean => [...n.tenants.keys()].some(ok);
    let node = this.root;
    let deepest: Node | null = null;
    let matched = 0;
    let i = 0;
    while (i < text.length) {
      const child = node.children.get(text[i]!);
      if (child === undefined || !holds(child)) break;
      const common = commonLength(child.edge, text, i);
      deepest = child;
      matched = i + common;
      if (common < child.edge.length) break;
      i += common;
      node = child;
    }
    return { matchedChars: matched, tenants: deepest === null ? [] : [...deepest.tenants.keys()].filter(ok) };
  }

  /** For every worker sharing a prefix with `text`, the length of its longest shared prefix (llm-d's per-pod score). */
  matchEach(text: string): Map<string, number> {
    const out = new Map<string, number>();
    let node = this.root;
    let i = 0;
    while (i < text.length) {
      const child = node.children.get(text[i]!);
      if (child === undefined) break;
      const common = commonLength(child.edge, text, i);
      // tenants only thin out along a path: a deeper node's length overwrites its workers' shorter ones
      for (const t of child.tenants.keys()) out.set(t, i + common);
      if (common < child.edge.length) break;
      i += common;
      node = child;
    }
    return out;
  }

  /** Characters the tree holds for `tenant` (0 for an unknown one). */
  size(tenant: string): number {
    return this.sizes.get(tenant) ?? 0;
  }

  /** Every worker with a size entry (inserted and not removed). */
  tenants(): string[] {
    return [...this.sizes.keys()];
  }

  /** Forgets everything `tenant` was sent (a worker removed, or down: its KV cache is gone). */
  removeTenant(tenant: string): void {
    const visit = (node: Node): void => {
      for (const child of [...node.children.values()]) {
        if (!child.tenants.has(tenant)) continue;
        visit(child);
        child.tenants.delete(tenant);
        if (child.tenants.size === 0) node.children.delete(child.edge[0]!);
      }
    };
    visit(this.root);
    this.sizes.delete(tenant);
  }

  /**
   * A policy's record of a routed request: `insert`, then `tenant`'s leaves trimmed back to `maxSize` once it holds
   * more than twice that (between the periodic evictions).
   */
  record(text: string, tenant: string, maxSize: number): void {
    if (text.length === 0) return;
    this.insert(text, tenant);
    if (this.size(tenant) > 2 * maxSize) this.evict(maxSize, tenant);
  }

  /**
   * Evicts, for every worker over `maxSize` characters, its least recently used leaves until it fits; returns the
   * characters evicted. A node no worker holds any more is unlinked.
   */
  evict(maxSize: number, only?: string): number {
    const over = [...this.sizes].filter(([t, size]) => size > maxSize && (only === undefined || t === only)).map(([t]) => t);
    let evicted = 0;
    for (const tenant of over) {
      const heap = new LeafHeap(tenant);
      this.forEachNode((n) => {
        if (n !== this.root && n.tenants.has(tenant) && ![...n.children.values()].some((c) => c.tenants.has(tenant))) heap.push(n);
      });
      let size = this.sizes.get(tenant)!;
      while (size > maxSize) {
        const leaf = heap.pop();
        if (leaf === undefined) break;
        leaf.tenants.delete(tenant);
        size -= leaf.edge.length;
        evicted += leaf.edge.length;
        const parent = leaf.parent!;
        if (leaf.tenants.size === 0) parent.children.delete(leaf.edge[0]!);
        // the parent becomes the tenant's leaf once none of its other children holds the tenant
        if (parent !== this.root && ![...parent.children.values()].some((c) => c.tenants.has(tenant))) heap.push(parent);
      }
      this.sizes.set(tenant, size);
    }
    return evicted;
  }

  /** Number of nodes below the root (for tests and memory checks). */
  nodeCount(): number {
    let n = -1;
    this.forEachNode(() => n++);
    return n;
  }

  /** Splits `node`'s edge after `at` characters: `node` keeps the head, a new single child takes the tail. */
  private split(node: Node, at: number): void {
    const tail = newNode(node.edge.slice(at), node, new Map(node.tenants));
    tail.children = node.children;
    for (const c of tail.children.values()) c.parent = tail;
    node.edge = node.edge.slice(0, at);
    node.children = new Map([[tail.edge[0]!, tail]]);
  }

  private forEachNode(fn: (n: Node) => void): void {
    const stack = [this.root];
    while (stack.length > 0) {
      const n = stack.pop()!;
      fn(n);
      for (const c of n.children.values()) stack.push(c);
    }
  }
}

/** A binary min-heap of one tenant's leaves by the time the tenant last used them. */
class LeafHeap {
  private readonly items: Node[] = [];
  constructor(private readonly tenant: string) {}

  private key(i: number): number {
    return this.items[i]!.tenants.get(this.tenant)!;
  }

  push(n: Node): void {
    const a = this.items;
    a.push(n);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (this.key(p) <= this.key(i)) break;
      [a[p], a[i]] = [a[i]!, a[p]!];
      i = p;
    }
  }

  pop(): Node | undefined {
    const a = this.items;
    if (a.length === 0) return undefined;
    const top = a[0]!;
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && this.key(l) < this.key(m)) m = l;
        if (r < a.length && this.key(r) < this.key(m)) m = r;
        if (m === i) break;
        [a[m], a[i]] = [a[i]!, a[m]!];
        i = m;
      }
    }
    return top;
  }
}
