// The pickle inside a torch.save archive (<archive>/data.pkl, protocol 2): what torch.load(weights_only=True) allows,
// as a small machine that knows a tensor's rebuild (torch._utils._rebuild_tensor_v2 over a storage given as a
// persistent id ("storage", torch.FloatStorage, key, location, numel)), parameters, and the OrderedDict of a state
// dict, and refuses every other global by name. Tensors come out as references into their storages (storage key,
// dtype, offset, size, stride); the caller reads <archive>/data/<key>.
import { KilnError } from "./errors.js";

export class TorchFileError extends KilnError {
  override name = "TorchFileError";
}

/** torch's storage classes by their pickled names, as safetensors dtype names. */
const STORAGE_DTYPES: Record<string, TorchStorageDtype> = {
  FloatStorage: "F32", HalfStorage: "F16", BFloat16Storage: "BF16", DoubleStorage: "F64", LongStorage: "I64", IntStorage: "I32",
  ShortStorage: "I16", CharStorage: "I8", ByteStorage: "U8", BoolStorage: "BOOL", Float8_e4m3fnStorage: "F8_E4M3", Float8_e5m2Storage: "F8_E5M2",
};
export type TorchStorageDtype = "F32" | "F16" | "BF16" | "F64" | "I64" | "I32" | "I16" | "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2";

export type PickleValue = null | boolean | number | bigint | string | PickleValue[] | PickleGlobal | StorageRef | TensorRef | Map<PickleValue, PickleValue>;

interface PickleGlobal {
  kind: "global";
  name: string;
}
export interface StorageRef {
  kind: "storage";
  /** A safetensors dtype name, or the storage class's own name when unknown (refused by readers). */
  dtype: TorchStorageDtype | string;
  key: string;
  numel: number;
}
export interface TensorRef {
  kind: "tensor";
  storage: StorageRef;
  offset: number;
  size: number[];
  stride: number[];
}

const isGlobal = (v: PickleValue): v is PickleGlobal => typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Map) && v.kind === "global";

/** Runs the pickle's opcodes that saved tensors and state dicts use; anything else is refused by name. */
export function unpickleTorch(p: Uint8Array): PickleValue {
  const view = new DataView(p.buffer, p.byteOffset, p.byteLength);
  const stack: PickleValue[] = [];
  const marks: number[] = [];
  const memo = new Map<number, PickleValue>();
  let i = 0;
  const fail = (why: string): never => {
    throw new TorchFileError(`data.pkl: ${why}`);
  };
  const need = (n: number) => (i + n <= p.length ? i : fail("truncated"));
  const line = (): string => {
    const end = p.indexOf(0x0a, i);
    if (end < 0) fail("truncated");
    const s = new TextDecoder().decode(p.subarray(i, end));
    i = end + 1;
    return s;
  };
  const text = (n: number): string => {
    need(n);
    const s = new TextDecoder().decode(p.subarray(i, i + n));
    i += n;
    return s;
  };
  const pop = (): PickleValue => (stack.length > 0 ? stack.pop()! : fail("stack underflow"));
  const popMark = (): PickleValue[] => {
    const m = marks.pop() ?? fail("no mark");
    return stack.splice(m);
  };
  const top = (): PickleValue => stack[stack.length - 1] ?? fail("stack underflow");
  const int = (v: PickleValue, what: string): number => (typeof v === "number" && Number.isSafeInteger(v) ? v : fail(`${what} is not an integer`));
  const ints = (v: PickleValue, what: string): number[] => (Array.isArray(v) ? v.map((x) => int(x, what)) : fail(`${what} is not a tuple`));
  const call = (fn: PickleValue, args: PickleValue): PickleValue => {
    if (!isGlobal(fn)) fail("a call of something that is not a known function");
    const a = Array.isArray(args) ? args : fail("call arguments are not a tuple");
    const f = (fn as PickleGlobal).name;
    if (f === "collections.OrderedDict" && a.length === 0) return new Map();
    // nn.Parameter(data, requires_grad, hooks): the data
    if (f === "torch._utils._rebuild_parameter" || f === "torch._utils._rebuild_parameter_with_state") return a[0] ?? fail("a parameter without data");
    if (f === "torch._utils._rebuild_tensor_v2" || f === "torch._utils._rebuild_tensor") {
      const s = a[0];
      if (typeof s !== "object" || s === null || Array.isArray(s) || s instanceof Map || s.kind !== "storage") fail("the tensor's storage is not a storage reference");
      return { kind: "tensor", storage: s as StorageRef, offset: int(a[1] ?? null, "storage offset"), size: ints(a[2] ?? null, "size"), stride: ints(a[3] ?? null, "stride") };
    }
    return fail(`${f} is not allowed (only a dense tensor is read, as torch.load(weights_only=True))`);
  };
  while (i < p.length) {
    const op = p[i++]!;
    switch (op) {
      case 0x80: need(1); i += 1; break; // PROTO
      case 0x95: need(8); i += 8; break; // FRAME
      case 0x63: { const module = line(); stack.push({ kind: "global", name: `${module}.${line()}` }); break; } // GLOBAL
      case 0x93: { const name = pop(), module = pop(); stack.push({ kind: "global", name: `${String(module)}.${String(name)}` }); break; } // STACK_GLOBAL
      case 0x28: marks.push(stack.length); break; // MARK
      case 0x74: stack.push(popMark()); break; // TUPLE
      case 0x29: stack.push([]); break; // EMPTY_TUPLE
      case 0x85: stack.push([pop()]); break; // TUPLE1
      case 0x86: { const b = pop(), a = pop(); stack.push([a, b]); break; } // TUPLE2
      case 0x87: { const c = pop(), b = pop(), a = pop(); stack.push([a, b, c]); break; } // TUPLE3
      case 0x5d: stack.push([]); break; // EMPTY_LIST
      case 0x61: { const v = pop(); const l = top(); if (!Array.isArray(l)) fail("APPEND to a non-list"); (l as PickleValue[]).push(v); break; }
      case 0x65: { const vs = popMark(); const l = top(); if (!Array.isArray(l)) fail("APPENDS to a non-list"); (l as PickleValue[]).push(...vs); break; }
      case 0x7d: stack.push(new Map()); break; // EMPTY_DICT
      case 0x73: { const v = pop(), k = pop(); const d = top(); if (!(d instanceof Map)) fail("SETITEM on a non-dict"); (d as Map<PickleValue, PickleValue>).set(k, v); break; }
      case 0x75: { const kv = popMark(); const d = top(); if (!(d instanceof Map)) fail("SETITEMS on a non-dict"); for (let k = 0; k + 1 < kv.length; k += 2) (d as Map<PickleValue, PickleValue>).set(kv[k]!, kv[k + 1]!); break; }
      case 0x4a: need(4); stack.push(view.getInt32(i, true)); i += 4; break; // BININT
      case 0x4b: need(1); stack.push(p[i++]!); break; // BININT1
      case 0x4d: need(2); stack.push(view.getUint16(i, true)); i += 2; break; // BININT2
      case 0x8a: { // LONG1: n little-endian two's-complement bytes
        need(1);
        const n = p[i++]!;
        need(n);
        let v = 0n;
        for (let b = n - 1; b >= 0; b--) v = (v << 8n) | BigInt(p[i + b]!);
        if (n > 0 && p[i + n - 1]! >= 0x80) v -= 1n << BigInt(8 * n);
        i += n;
        stack.push(v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v);
        break;
      }
      case 0x58: { need(4); const n = view.getUint32(i, true); i += 4; stack.push(text(n)); break; } // BINUNICODE
      case 0x8c: { need(1); const n = p[i++]!; stack.push(text(n)); break; } // SHORT_BINUNICODE
      case 0x55: { need(1); const n = p[i++]!; stack.push(text(n)); break; } // SHORT_BINSTRING
      case 0x47: need(8); stack.push(view.getFloat64(i, false)); i += 8; break; // BINFLOAT
      case 0x4e: stack.push(null); break; // NONE
      case 0x88: stack.push(true); break; // NEWTRUE
      case 0x89: stack.push(false); break; // NEWFALSE
      case 0x71: need(1); memo.set(p[i++]!, top()); break; // BINPUT
      case 0x72: need(4); memo.set(view.getUint32(i, true), top()); i += 4; break; // LONG_BINPUT
      case 0x94: memo.set(memo.size, top()); break; // MEMOIZE
      case 0x68: need(1); stack.push(memo.has(p[i]!) ? memo.get(p[i++]!)! : fail("a memo reference to nothing")); break; // BINGET
      case 0x6a: { need(4); const k = view.getUint32(i, true); i += 4; stack.push(memo.has(k) ? memo.get(k)! : fail("a memo reference to nothing")); break; } // LONG_BINGET
      case 0x51: { // BINPERSID: ("storage", storage type, key, location, numel)
        const popped = pop();
        const pid = Array.isArray(popped) ? popped : [];
        if (pid[0] !== "storage" || pid.length < 5 || !isGlobal(pid[1]!)) fail("a persistent id that is not a storage");
        const type = pid[1] as PickleGlobal;
        const short = type.name.replace(/^torch\./, "");
        stack.push({ kind: "storage", dtype: STORAGE_DTYPES[short] ?? short, key: String(pid[2]), numel: int(pid[4]!, "storage size") });
        break;
      }
      case 0x52: { const args = pop(), fn = pop(); stack.push(call(fn, args)); break; } // REDUCE
      case 0x62: pop(); break; // BUILD: a tensor's state (none for a plain tensor) changes nothing read here
      case 0x2e: return stack.length === 1 ? stack[0]! : fail("the pickle does not end with one value"); // STOP
      default:
        fail(`pickle opcode 0x${op.toString(16)} is not read`);
    }
  }
  return fail("no STOP opcode");
}


/** Whether a pickled value is a tensor reference. */
export function isTensorRef(v: PickleValue): v is TensorRef {
  return typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Map) && v.kind === "tensor";
}
