// Weights and KV caches on huge pages (Backend.moveToHugePages): a moved buffer keeps its handle, bytes and
// results, small buffers stay where they are, and with transparent huge pages available (madvise or always)
// the process's anonymous huge-page memory grows by the moved bytes.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import { describe, it } from "node:test";
import { getBackend } from "../../src/backends/registry.js";
import { tensor, zeros } from "../../src/tensor/index.js";

const cpu = getBackend("cpu");

/** AnonHugePages of this process in bytes, or null where the kernel does not report it. */
function anonHugeBytes(): number | null {
  try {
    const m = /AnonHugePages:\s+(\d+) kB/.exec(fs.readFileSync("/proc/self/smaps_rollup", "utf8"));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}

function thpMode(): string | null {
  try {
    return /\[(\w+)\]/.exec(fs.readFileSync("/sys/kernel/mm/transparent_hugepage/enabled", "utf8"))?.[1] ?? null;
  } catch {
    return null;
  }
}

describe("moveToHugePages", () => {
  it("moves a weight: same handle and values, same matmul result; a moved or small buffer is not moved again", () => {
    const w = tensor(Float32Array.from({ length: 512 * 256 }, (_, i) => Math.sin(i * 0.01)), { shape: [512, 256], device: "cpu" });
    const x = tensor(Float32Array.from({ length: 3 * 256 }, (_, i) => Math.cos(i * 0.02)), { shape: [3, 256], device: "cpu" });
    const before = [...x.matmul(w.T).dataSync()];
    const values = [...w.dataSync()];
    const buffer = w.storage.buffer;
    assert.equal(cpu.moveToHugePages!([buffer, buffer]), 512 * 256 * 4);
    assert.equal(w.storage.buffer, buffer, "the tensor keeps its buffer handle");
    assert.deepEqual([...w.dataSync()], values);
    assert.deepEqual([...x.matmul(w.T).dataSync()], before);
    assert.equal(cpu.moveToHugePages!([buffer]), 0, "already on huge pages");
    const small = tensor(Float32Array.from([1, 2, 3]), { device: "cpu" });
    assert.equal(cpu.moveToHugePages!([small.storage.buffer]), 0, "a 12-byte buffer stays");
    assert.deepEqual([...small.dataSync()], [1, 2, 3]);
    w.mul_(2); // the moved memory is written through the same handle
    assert.equal(w.dataSync()[1], (values[1] as number) * 2);
  });

  it("maxBytes: buffers move in order while the bytes moved stay within it; one past it stays, a later smaller one moves", () => {
    const a = zeros([128, 256], { device: "cpu" }).add(2);
    const b = zeros([256, 256], { device: "cpu" }).add(3);
    const c = zeros([64, 256], { device: "cpu" }).add(4);
    const bufs = [a.storage.buffer, b.storage.buffer, c.storage.buffer];
    const [sa, sb, sc] = [128 * 256 * 4, 256 * 256 * 4, 64 * 256 * 4];
    assert.equal(cpu.moveToHugePages!(bufs, { maxBytes: sc - 1 }), 0, "none fits");
    // a fits, b would pass the budget, c still fits beside a
    assert.equal(cpu.moveToHugePages!(bufs, { maxBytes: sa + sc + 1 }), sa + sc);
    assert.equal(cpu.moveToHugePages!(bufs, { maxBytes: sb - 1 }), 0, "a and c moved already; b is over the budget");
    assert.equal(cpu.moveToHugePages!(bufs, { maxBytes: sb }), sb);
    assert.ok(a.dataSync().every((v) => v === 2) && b.dataSync().every((v) => v === 3) && c.dataSync().every((v) => v === 4));
  });

  it("discard: the buffer gets zeroed memory and its old bytes are not copied", () => {
    const t = zeros([256, 256], { device: "cpu" }).add(1);
    assert.equal(cpu.moveToHugePages!([t.storage.buffer], { discard: true }), 256 * 256 * 4);
    assert.ok(t.dataSync().every((v) => v === 0));
  });

  // Minor page faults of the whole process (other threads' faults count too: the bounds leave room for them) while
  // every 4 KiB page of `bytes` is written through a host view (no kernel runs).
  const faultsWriting = (bytes: Uint8Array): number => {
    const before = process.resourceUsage().minorPageFault;
    for (let at = 0; at < bytes.length; at += 4096) bytes[at] = 7;
    return process.resourceUsage().minorPageFault - before;
  };

  it("the moved pages are faulted in by the move: writing every page after it faults none", () => {
    // fresh ordinary memory: one fault per 4 KiB page (65536), or per 2 MiB (128) under THP "always"
    const fresh = faultsWriting(new Uint8Array(256 << 20));
    assert.ok(fresh >= 100, `${fresh} faults writing fresh memory`);
    const t = zeros([(256 << 20) / 4], { device: "cpu" });
    assert.equal(cpu.moveToHugePages!([t.storage.buffer], { discard: true }), 256 << 20);
    // unpopulated huge pages would fault 128 times (one per 2 MiB), ordinary ones 65536
    const moved = faultsWriting(new Uint8Array(t.storage.buffer.host!));
    assert.ok(moved < 48, `${moved} faults writing moved memory`);
    assert.equal(new Uint8Array(t.dataSync().buffer)[4096], 7, "the writes went to the tensor's memory");
    t.dispose();
  });

  it("populate: a buffer's pages fault in at the call, keeping its bytes (ordinary pages)", (ctx) => {
    const fresh = cpu.allocate(32 << 20);
    const control = cpu.allocate(32 << 20);
    cpu.write(fresh, 5 * 4096 + 1, Uint8Array.of(42)); // one page written before: its byte stays
    cpu.populate!([fresh]);
    const populated = faultsWriting(new Uint8Array(fresh.host!));
    const lazy = faultsWriting(new Uint8Array(control.host!));
    cpu.free(control);
    assert.equal(cpu.read(fresh, 5 * 4096 + 1, 1)[0], 42);
    cpu.free(fresh);
    // under THP "always" fresh memory faults once per 2 MiB (16 here): too few to tell from the noise
    if (lazy < 2048) return ctx.skip(`fresh memory faulted ${lazy} times (huge pages): populate's effect is not measurable here`);
    assert.ok(populated < 256, `${populated} faults writing populated memory (fresh memory: ${lazy})`);
  });

  it("with transparent huge pages on, the moved bytes are backed by huge pages", (ctx) => {
    const mode = thpMode();
    const before = anonHugeBytes();
    if ((mode !== "madvise" && mode !== "always") || before === null) return ctx.skip(`transparent huge pages: ${mode ?? "not reported"}`);
    const bytes = 64 << 20;
    const t = zeros([bytes / 4], { device: "cpu" });
    cpu.moveToHugePages!([t.storage.buffer]);
    t.add_(1); // touch every page
    const grown = anonHugeBytes()! - before;
    assert.ok(grown >= bytes / 2, `AnonHugePages grew by ${grown} bytes for a ${bytes}-byte buffer`);
    assert.equal(t.dataSync()[12345], 1);
  });
});
