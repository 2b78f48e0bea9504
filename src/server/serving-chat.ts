// POST /v1/chat/completions: chat template -> engine -> chat.completion or chat.completion.chunk SSE.
import type { FastifyReply, FastifyRequest } from "fastify";
import type { CompletionOutput, FinishReason, RequestOutput, TokenLogprobs } from "../engine/types.js";
import { badRequest } from "./errors.js";
import { primeStream, streamEngineRequest } from "./engine-stream.js";
import { parseChatRequest, type ChatRequest } from "./protocol.js";
import {
  abortOnDisconnect, checkQueue, clampLogprob, nowSeconds, promptLogprobsJson, randomId, resolveModel, samplingParamsFor,
  SseWriter, tokenText, type ServingContext,
} from "./serving-context.js";

interface ChatLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

const utf8Bytes = (s: string): number[] => Array.from(Buffer.from(s, "utf8"));

/** OpenAI chat logprobs entries for newly generated tokens. */
function chatLogprobs(ctx: ServingContext, o: CompletionOutput, top: number): ChatLogprob[] {
  const lps = o.logprobs ?? [];
  return o.tokenIds.map((id, i) => {
    const lp: TokenLogprobs | undefined = lps[i];
    const token = tokenText(ctx, id, lp);
    const ranked = lp ? [...lp.entries()].sort((a, b) => a[1].rank - b[1].rank).slice(0, top) : [];
    return {
      token,
      logprob: clampLogprob(lp?.get(id)?.logprob ?? -9999),
      bytes: utf8Bytes(token),
      top_logprobs: ranked.map(([tid, l]) => {
        const t = tokenText(ctx, tid, lp);
        return { token: t, logprob: clampLogprob(l.logprob), bytes: utf8Bytes(t) };
      }),
    };
  });
}

interface Choice {
  text: string;
  numTokens: number;
  logprobs: ChatLogprob[];
  finishReason: FinishReason;
  stopReason: string | number | null;
}

/** An OpenAI tool call of a chat message (arguments as JSON text). */
interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/**
 * The tool calls of a reply whose text was constrained by tool_choice (see parseTools): a named function's text
 * is its arguments; "required" text is a JSON list of {name, parameters}, each becoming a call (vLLM's reading).
 * Null when the text is no complete list (a reply cut at max_tokens): the reply is then left as text.
 */
function toolCallsOf(req: ChatRequest, text: string): ToolCall[] | null {
  const tc = req.toolChoice;
  if (tc.kind === "named") return [{ id: randomId("chatcmpl-tool"), type: "function", function: { name: tc.name, arguments: text } }];
  if (tc.kind !== "required") return null;
  let calls: unknown;
  try {
    calls = JSON.parse(text);
  } catch {
    return null;
  }
  if (!Array.isArray(calls)) return null;
  const out: ToolCall[] = [];
  for (const c of calls) {
    const o = c as { name?: unknown; parameters?: unknown } | null;
    if (typeof o !== "object" || o === null || typeof o.name !== "string") return null;
    out.push({ id: randomId("chatcmpl-tool"), type: "function", function: { name: o.name, arguments: JSON.stringify(o.parameters ?? {}) } });
  }
  return out;
}

export async function handleChat(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const req = parseChatRequest(request.body, ctx.tokenizer.vocabSize);
  const model = resolveModel(ctx, req.model);
  let promptText: string;
  try {
    promptText = ctx.tokenizer.applyChatTemplate(req.messages, {
      addGenerationPrompt: req.addGenerationPrompt,
      continueFinalMessage: req.continueFinalMessage,
      ...(req.tools ? { tools: req.tools } : {}),
      ...(req.chatTemplate ?? ctx.chatTemplate ? { chatTemplate: req.chatTemplate ?? ctx.chatTemplate } : {}),
      ...(req.chatTemplateKwargs ? { chatTemplateKwargs: req.chatTemplateKwargs } : {}),
    });
  } catch (err) {
    throw badRequest(`Failed to apply the chat template: ${(err as Error).message}`, "messages");
  }
  const promptTokenIds = ctx.tokenizer.encode(promptText, { addSpecialTokens: false });
  const params = samplingParamsFor(ctx, req, promptTokenIds.length, "messages");
  checkQueue(ctx);

  const id = randomId("chatcmpl");
  const created = nowSeconds();
  const n = params.n ?? 1;
  const controller = new AbortController();
  abortOnDisconnect(request, reply, controller);
  const stream = streamEngineRequest(ctx.engine, ctx.metrics, ctx.inflight, ctx.unstarted,
    { requestId: id, promptTokenIds, prompt: promptText, params, priority: req.priority, ...(req.cacheSalt ? { cacheSalt: req.cacheSalt } : {}) },
    controller.signal);
  // echo: repeat the final message's content when the model continues it (vLLM semantics).
  const last = req.messages[req.messages.length - 1]!;
  const echoText = req.echo && last.role === "assistant" && !req.addGenerationPrompt ? (last.content ?? "") : "";

  try {
    const outputs = await primeStream(stream);
    if (req.stream) return await streamChat(ctx, req, reply, outputs, { id, created, model, n, promptLen: promptTokenIds.length, echoText });
    return await collectChat(ctx, req, outputs, { id, created, model, n, promptLen: promptTokenIds.length, echoText });
  } finally {
    controller.abort(); // no-op for finished requests; frees blocks if we leave early
  }
}

interface ResponseInfo {
  id: string;
  created: number;
  model: string;
  n: number;
  promptLen: number;
  echoText: string;
}

async function collectChat(ctx: ServingContext, req: ChatRequest, outputs: AsyncIterable<RequestOutput>, info: ResponseInfo) {
  const choices: Choice[] = Array.from({ length: info.n }, () => ({ text: info.echoText, numTokens: 0, logprobs: [], finishReason: null, stopReason: null }));
  let promptLogprobs: (TokenLogprobs | null)[] | null = null;
  for await (const out of outputs) {
    promptLogprobs ??= out.promptLogprobs;
    for (const o of out.outputs) {
      const c = choices[o.index]!;
      if (c.finishReason !== null) continue; // finished samples may be listed again with empty deltas
      c.text += o.text;
      c.numTokens += o.tokenIds.length;
      if (req.topLogprobs !== null) c.logprobs.push(...chatLogprobs(ctx, o, req.topLogprobs));
      if (o.finishReason !== null) {
        c.finishReason = o.finishReason;
        c.stopReason = o.stopReason;
      }
    }
  }
  const completionTokens = choices.reduce((s, c) => s + c.numTokens, 0);
  return {
    id: info.id,
    object: "chat.completion",
    created: info.created,
    model: info.model,
    choices: choices.map((c, index) => ({
      index,
      message: chatMessage(req, c.text),
      logprobs: req.topLogprobs !== null ? { content: c.logprobs } : null,
      finish_reason: c.finishReason ?? "abort",
      stop_reason: c.stopReason,
    })),
    usage: { prompt_tokens: info.promptLen, completion_tokens: completionTokens, total_tokens: info.promptLen + completionTokens },
    ...(req.returnPromptLogprobs ? { prompt_logprobs: promptLogprobsJson(promptLogprobs) } : {}),
  };
}

/** The reply's message: its text, or (tool_choice required or named) its tool calls with empty content, as vLLM. */
function chatMessage(req: ChatRequest, text: string): { role: "assistant"; content: string; refusal: null; tool_calls: ToolCall[] } {
  const calls = toolCallsOf(req, text);
  return { role: "assistant", content: calls === null ? text : "", refusal: null, tool_calls: calls ?? [] };
}

async function streamChat(
  ctx: ServingContext, req: ChatRequest, reply: FastifyReply, outputs: AsyncIterable<RequestOutput>, info: ResponseInfo,
): Promise<FastifyReply> {
  const sse = new SseWriter(reply);
  const base = { id: info.id, object: "chat.completion.chunk", created: info.created, model: info.model };
  const usageField = req.includeUsage ? { usage: null } : {};
  let completionTokens = 0;
  const usage = () => ({ prompt_tokens: info.promptLen, completion_tokens: completionTokens, total_tokens: info.promptLen + completionTokens });
  try {
    for (let index = 0; index < info.n; index++) {
      const delta = { role: "assistant", content: info.echoText };
      await sse.send({ ...base, choices: [{ index, delta, logprobs: null, finish_reason: null }], ...usageField });
    }
    const done = new Set<number>(); // an engine may keep listing finished samples with empty deltas
    const tools = new ToolCallStream(req, info.n);
    for await (const out of outputs) {
      for (const o of out.outputs) {
        if (done.has(o.index)) continue;
        if (o.finishReason !== null) done.add(o.index);
        completionTokens += o.tokenIds.length;
        if (o.text === "" && o.finishReason === null && o.tokenIds.length === 0) continue;
        const delta = tools.delta(o.index, o.text, o.finishReason !== null);
        if (Object.keys(delta).length === 0 && o.finishReason === null && req.topLogprobs === null) continue; // held back
        const choice = {
          index: o.index,
          delta,
          logprobs: req.topLogprobs !== null ? { content: chatLogprobs(ctx, o, req.topLogprobs) } : null,
          finish_reason: o.finishReason,
          ...(o.finishReason !== null ? { stop_reason: o.stopReason } : {}),
        };
        await sse.send({ ...base, choices: [choice], ...(req.continuousUsageStats ? { usage: usage() } : usageField) });
      }
      if (sse.closed) break;
    }
    if (req.includeUsage) await sse.send({ ...base, choices: [], usage: usage() });
    await sse.end();
  } catch (err) {
    await sse.end(err);
  }
  return reply;
}

/**
 * Streamed tool calls, as vLLM streams them: a named function's call opens with its id and name, and each text
 * delta is an arguments delta. "required" replies are JSON lists that are only calls once complete: their calls
 * come in the sample's last chunk, one tool_calls entry each (the text before that is held back).
 */
class ToolCallStream {
  private readonly text: string[];
  private readonly opened: boolean[];

  constructor(
    private readonly req: ChatRequest,
    n: number,
  ) {
    this.text = new Array<string>(n).fill("");
    this.opened = new Array<boolean>(n).fill(false);
  }

  delta(index: number, text: string, last: boolean): Record<string, unknown> {
    const tc = this.req.toolChoice;
    if (tc.kind === "none") return { content: text };
    if (tc.kind === "named") {
      if (this.opened[index]) return { tool_calls: [{ index: 0, function: { arguments: text } }] };
      this.opened[index] = true;
      return { tool_calls: [{ index: 0, id: randomId("chatcmpl-tool"), type: "function", function: { name: tc.name, arguments: text } }] };
    }
    this.text[index] += text;
    if (!last) return {};
    const calls = toolCallsOf(this.req, this.text[index]!);
    if (calls === null) return { content: this.text[index] };
    return { tool_calls: calls.map((c, i) => ({ index: i, ...c })) };
  }
}
