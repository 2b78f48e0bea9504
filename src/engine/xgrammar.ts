// xgrammar (the grammar engine vLLM uses for structured output), from its WebAssembly build
// `@mlc-ai/web-xgrammar`, driven synchronously.
//
// The package's own classes are async (every call awaits the module's start-up), while Kiln's engine step is
// synchronous. So this file evaluates the package's bundle with two edits that make its Emscripten module
// start synchronously and hands back the raw Embind classes:
//   - the module factory, private to the bundle, is exported next to the classes;
//   - Node's `await import('module')`, the one await before the module starts, becomes `require('module')`;
// and instantiates the module's embedded wasm with WebAssembly.Instance, so a new instance is ready when the
// factory returns (~20 ms; the wasm compile, ~40 ms, is shared by all instances).
//
// xgrammar reports a bad grammar in one of two ways: a fatal error that aborts the wasm call (its message goes
// to stderr, which an instance here captures), or a C++ exception, which reaches JS as the exception's address
// (its message is read from the heap). Either way the call did not unwind the wasm stack, so the instance is not
// used again: {@link XgrammarInstance.call} marks it broken, and callers make a new one.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import vm from "node:vm";

/** A C++ object owned by the wasm heap: free it with delete(). */
export interface XgObject {
  delete(): void;
}
export type XgVectorInt = XgObject;
export interface XgGrammar extends XgObject {
  /** The grammar as xgrammar EBNF text. */
  ToString(): string;
}
export type XgCompiledGrammar = XgObject;
export interface XgGrammarCompiler extends XgObject {
  CompileGrammar(grammar: XgGrammar): XgCompiledGrammar;
}
export interface XgGrammarMatcher extends XgObject {
  AcceptToken(tokenId: number, verbose: boolean): boolean;
  GetNextTokenBitmask(vocabSize: number): XgVectorInt;
  IsTerminated(): boolean;
  Rollback(numTokens: number): void;
}
export type XgTokenizerInfo = XgObject;

/** The Embind surface of the module (what the package's classes wrap). */
export interface XgBinding {
  Grammar: {
    FromEBNF(ebnf: string, rootRule: string): XgGrammar;
    FromJSONSchema(
      schema: string,
      anyWhitespace: boolean,
      indent: number | undefined,
      separators: { first: string; second: string } | undefined,
      strictMode: boolean,
      maxWhitespaceCnt: number | undefined,
      printConverted: boolean,
    ): XgGrammar;
    FromStructuralTag(json: string): XgGrammar;
  };
  TokenizerInfo: new (
    encodedVocab: XgObject,
    vocabType: "RAW" | "BYTE_FALLBACK" | "BYTE_LEVEL",
    vocabSize: number,
    stopTokenIds: XgVectorInt | undefined,
    prependSpace: boolean,
  ) => XgTokenizerInfo;
  GrammarCompiler: new (info: XgTokenizerInfo, maxThreads: number, cacheEnabled: boolean) => XgGrammarCompiler;
  GrammarMatcher: new (
    compiled: XgCompiledGrammar,
    overrideStopTokens: XgVectorInt | undefined,
    terminateWithoutStopToken: boolean,
    maxRollbackTokens: number,
  ) => XgGrammarMatcher;
  vecStringFromJSArray(a: string[]): XgObject;
  vecIntFromJSArray(a: number[]): XgVectorInt;
  /** A view of the vector's data in the wasm heap: valid until the vector is deleted or the heap grows. */
  vecIntToView(v: XgVectorInt): Int32Array;
}

/** A grammar the engine cannot use (its message is xgrammar's). */
export class XgrammarError extends Error {
  override name = "XgrammarError";
}

type ModuleFactory = (moduleArg: object) => unknown;

/** The part of the WebAssembly global used here (Node has it; the compiler's libs here do not declare it). */
interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: object };
  RuntimeError: new (message?: string) => Error;
}
const Wasm = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

let loaded: { factory: ModuleFactory; wasm: object } | null = null;

/** Evaluates the package's bundle once (see the file comment). */
function load(): { factory: ModuleFactory; wasm: object } {
  if (loaded !== null) return loaded;
  const require = createRequire(import.meta.url);
  const file = require.resolve("@mlc-ai/web-xgrammar");
  let src = readFileSync(file, "utf8");
  const edits: [string, string][] = [
    ["let binding = null;", "let binding = null; exports.__kilnModuleFactory = Module;"],
    ["await import('module')", "require('module')"],
  ];
  for (const [from, to] of edits) {
    if (!src.includes(from)) throw new Error(`[xgrammar] ${file} is not the bundle Kiln expects (pinned @mlc-ai/web-xgrammar 0.1.27): no ${JSON.stringify(from)}`);
    src = src.replace(from, to);
  }
  const wasm64 = /wasmBinaryFile="data:application\/octet-stream;base64,([A-Za-z0-9+/=]+)"/.exec(src);
  if (wasm64 === null) throw new Error(`[xgrammar] ${file}: no embedded wasm`);
  const wrapper = vm.runInThisContext(`(function (exports, module, require, __filename, __dirname) {${src}\n})`, { filename: file }) as (
    ...args: unknown[]
  ) => void;
  const exports: { __kilnModuleFactory?: ModuleFactory } = {};
  wrapper(exports, { exports }, require, file, file.slice(0, file.lastIndexOf("/")));
  if (typeof exports.__kilnModuleFactory !== "function") throw new Error(`[xgrammar] ${file}: the module factory was not exported`);
  loaded = { factory: exports.__kilnModuleFactory, wasm: new Wasm.Module(Buffer.from(wasm64[1]!, "base64")) };
  return loaded;
}

/** One instance of the wasm module: its own heap, its own captured error output. */
export class XgrammarInstance {
  readonly binding: XgBinding;
  private stderr: string[] = [];
  /** Set once a call aborted: the heap may hold half-built state, so nothing more is run on it. */
  broken = false;

  constructor() {
    const { factory, wasm } = load();
    const arg: Record<string, unknown> = {
      instantiateWasm: (imports: object, receive: (i: { exports: object }, m: object) => void) => {
        const instance = new Wasm.Instance(wasm, imports);
        receive(instance, wasm);
        return instance.exports;
      },
      print: () => {},
      printErr: (line: string) => {
        this.stderr.push(line);
      },
    };
    void factory(arg); // a promise too, but the module is ready when the call returns
    if (typeof arg.GrammarMatcher !== "function") throw new Error("[xgrammar] the wasm module did not start synchronously");
    this.binding = arg as unknown as XgBinding;
  }

  /**
   * Runs `f` on the binding; an abort, a C++ exception or a stack overflow becomes an XgrammarError with xgrammar's
   * message and breaks the instance.
   */
  call<T>(f: (b: XgBinding) => T): T {
    if (this.broken) throw new Error("[xgrammar] this instance failed earlier and cannot be used");
    this.stderr = [];
    try {
      return f(this.binding);
    } catch (e) {
      if (typeof e === "number") {
        this.broken = true;
        throw new XgrammarError(this.exceptionMessage(e) ?? "xgrammar refused it");
      }
      // a deep grammar can exhaust the native stack inside the wasm call (V8 throws a RangeError there)
      if (!(e instanceof Wasm.RuntimeError) && !(e instanceof RangeError)) throw e;
      this.broken = true;
      const fatal = this.stderr.find((l) => l.includes("[FATAL]")) ?? this.stderr.join("\n");
      throw new XgrammarError(fatal.replace(/^.*\[FATAL\][^:]*:\d+: */, "").replace(/^Check failed: \(.*?\) is false: */, "") || String(e));
    }
  }

  /**
   * The what() of a thrown std::runtime_error / std::logic_error at `ptr` (libc++ keeps the message's address
   * right after the vtable pointer), or null when that does not hold text.
   */
  private exceptionMessage(ptr: number): string | null {
    const b = this.binding as unknown as { HEAPU8: Uint8Array; HEAPU32: Uint32Array };
    if (!Number.isInteger(ptr) || ptr <= 0 || ptr + 8 > b.HEAPU8.length) return null;
    const at = b.HEAPU32[(ptr + 4) >>> 2]!;
    if (at === 0 || at >= b.HEAPU8.length) return null;
    let end = at;
    while (end < b.HEAPU8.length && end - at < 2000 && b.HEAPU8[end] !== 0) end++;
    const text = new TextDecoder("utf-8", { fatal: false }).decode(b.HEAPU8.subarray(at, end));
    return text.length > 0 && !/[\x00-\x08\x0e-\x1f]/.test(text) ? text : null;
  }
}
