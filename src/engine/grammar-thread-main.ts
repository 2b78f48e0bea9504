// The grammar thread (spawned by GrammarThread, grammar-thread.ts): compiles specs against the vocabulary on its
// own wasm instance and answers the calls of the matchers it holds, in the order they come. Every call but
// dispose is answered on the replies port, then the shared counter is bumped so the engine's thread wakes.
import { parentPort, workerData } from "node:worker_threads";
import type { GrammarThreadData, GrammarThreadReply, ToGrammarThread } from "./grammar-thread.js";
import { StructuredOutputManager, type GrammarMatcher } from "./structured-output.js";

const { vocab, vocabSize, stopTokenIds, signal, replies } = workerData as GrammarThreadData;
const counter = new Int32Array(signal);
let manager: StructuredOutputManager | null = null;
const matchers = new Map<number, GrammarMatcher>();

/** The compiler, made again after xgrammar aborted inside it (a wasm instance that failed cannot be used again). */
function compiler(): StructuredOutputManager {
  if (manager === null || manager.instance.broken) manager = new StructuredOutputManager(vocab, vocabSize, stopTokenIds);
  return manager;
}

function answer(m: ToGrammarThread): GrammarThreadReply | null {
  switch (m.op) {
    case "compile":
      for (const id of m.matchers) matchers.set(id, compiler().compileMatcher(m.spec));
      return { call: m.call };
    case "accept": {
      const g = matchers.get(m.matcher)!;
      const ok = g.acceptToken(m.tokenId);
      return { call: m.call, ok, terminated: g.isTerminated() };
    }
    case "rollback": {
      const g = matchers.get(m.matcher)!;
      g.rollback(m.n);
      return { call: m.call, terminated: g.isTerminated() };
    }
    case "mask":
      return { call: m.call, mask: matchers.get(m.matcher)!.nextTokenBitmask() };
    case "dispose":
      matchers.get(m.matcher)?.dispose();
      matchers.delete(m.matcher);
      return null;
  }
}

parentPort!.on("message", (m: ToGrammarThread) => {
  let reply: GrammarThreadReply | null;
  try {
    reply = answer(m);
  } catch (e) {
    reply = { call: m.call, error: (e as Error).message };
  }
  if (reply === null) return;
  replies.postMessage(reply, reply.mask !== undefined ? [reply.mask.buffer as ArrayBuffer] : []);
  Atomics.add(counter, 0, 1);
  Atomics.notify(counter, 0);
});
