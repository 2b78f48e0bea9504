// POST /v1/completions: one engine request per prompt; choice index = promptIndex * n + sampleIndex (as vLLM).
import type { FastifyReply, FastifyRequest } from "fastify";
import type { CompletionOutput, FinishReason, RequestOutput, TokenLogprobs } from "../engine/types.js";
import { mergeStreams, primeStream, streamEngineRequest } from "./engine-stream.js";
import { beamFinishReason, runBeamSearch } from "./serving-beam.js";
import { asJsonBody, parseCompletionRequest, refuseRequestLogitsProcessors, type CompletionRequest } from "./protocol.js";
import type { KvSnapshot } from "../engine/kv-transfer.js";
import { IncrementalDetokenizer } from "../engine/detokenizer.js";
import { badRequest } from "./errors.js";
import type { Json } from "./fields.js";
import { kvTransferField, planKvTransfer, type KvTransferPlan } from "./kv-transfer.js";
import type { MultiModalFeature } from "../engine/model-runner.js";
import { readPromptEmbeds } from "./prompt-embeds.js";
import {
  abortOnDisconnect, checkQueue, forceUsage, clampLogprob, logprobToken, nowSeconds, promptLogprobsJson, resolveModelAndLora, responseIds,
  samplingParamsFor, SseWriter, tokenText, truncatePrompt, usageJson, type ServingContext,
} from "./serving-context.js";

/** OpenAI legacy logprobs: parallel lists plus character (code point) offsets into the choice text. */
interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

const emptyLogprobs = (): CompletionLogprobs => ({ tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] });

/** Characters as OpenAI and vLLM (Python's len) count them in text_offset: code points, not UTF-16 units. */
function charCount(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n--;
      i++;
    }
  }
  return n;
}

/**
 * Appends entries for `ids` (with per-token logprob maps, null for a prompt's first token) to `into`. `asIds`
 * (return_tokens_as_token_ids): tokens are named "token_id:<id>"; text_offset still counts the text's characters.
 * Offsets run from `offset` by each token's text, unless `starts` gives every token's own (an echoed prompt's).
 */
function appendLogprobs(
  ctx: ServingContext, into: CompletionLogprobs, ids: readonly number[], lps: readonly (TokenLogprobs | null | undefined)[],
  top: number, offset: number, asIds: boolean, starts?: readonly number[],
): number {
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    const lp = lps[i];
    const token = logprobToken(ctx, id, lp, asIds);
    into.tokens.push(token);
    if (starts !== undefined) offset = starts[i]!;
    into.text_offset.push(offset);
    offset += charCount(asIds ? tokenText(ctx, id, lp) : token);
    if (!lp) {
      into.token_logprobs.push(null);
      into.top_logprobs.push(null);
      continue;
    }
    into.token_logprobs.push(clampLogprob(lp.get(id)?.logprob ?? -9999));
    const ranked = [...lp.entries()].sort((a, b) => a[1].rank - b[1].rank);
    const topMap: Record<string, number> = {};
    for (const [tid, l] of ranked.slice(0, top)) topMap[logprobToken(ctx, tid, lp, asIds)] = clampLogprob(l.logprob);
    topMap[token] = clampLogprob(lp.get(id)?.logprob ?? -9999); // the sampled token is always listed
    into.top_logprobs.push(topMap);
  }
  return offset;
}

interface Prepared {
  promptTokenIds: number[];
  /** The text echo repeats: the prompt as given, or its token ids decoded with their special tokens. */
  promptText: string;
  /** Whether the prompt was text: special tokens the tokenizer added (BOS) are then not in promptText. */
  fromText: boolean;
  /** Where each prompt token starts in promptText (echo with logprobs), computed once for its choices. */
  echoOffsets?: number[];
  /** A prompt given as embeddings (prompt_embeds): its placeholder ids' feature. */
  embeds?: MultiModalFeature;
}

/**
 * Where each prompt token starts in the echoed prompt text: the running length of the text the tokens decode to, so
 * that a special token the tokenizer added to a text prompt (BOS) takes no characters and does not shift the rest
 * (vLLM adds its "<s>"'s length). A prompt given as ids echoes them with their special tokens, which then count.
 * Aligned to the text's end (a prompt cut by truncate_prompt_tokens echoes whole) and clamped into it.
 */
function promptTextOffsets(ctx: ServingContext, p: Prepared): number[] {
  const detokenizer = new IncrementalDetokenizer(ctx.tokenizer, [], { skipSpecialTokens: p.fromText });
  const starts: number[] = [];
  let decoded = "";
  let chars = 0;
  for (const id of p.promptTokenIds) {
    starts.push(chars);
    const piece = detokenizer.push([id]);
    decoded += piece;
    chars += charCount(piece);
  }
  decoded += detokenizer.finish();
  const text = p.promptText;
  const textChars = charCount(text);
  const shift = decoded.length < text.length && text.endsWith(decoded) ? textChars - charCount(decoded) : 0;
  return starts.map((start) => Math.min(textChars, start + shift));
}

/**
 * --skip-tokenizer-init: what needs the vocabulary is refused, as vLLM refuses it (prompts must be token ids; nothing
 * is detokenized, so no stop strings, bad words or grammars); stop_token_ids and the EOS ids still stop.
 */
function refuseWithoutTokenizer(req: CompletionRequest): void {
  const why = "the server was started with --skip-tokenizer-init (no tokenizer)";
  if (req.prompts.some((p) => "text" in p)) throw badRequest(`prompt must be token ids (a list of integers, or a list of such lists): ${why}`, "prompt");
  if ((req.params.stop?.length ?? 0) > 0) throw badRequest(`stop strings are not supported: ${why}, so no text is detokenized; use stop_token_ids`, "stop");
  if ((req.params.badWords?.length ?? 0) > 0) throw badRequest(`bad_words are not supported: ${why}`, "bad_words");
  if (req.params.structuredOutputs != null) throw badRequest(`structured output is not supported: ${why}`, "structured_outputs");
}

interface Choice {
  text: string;
  numTokens: number;
  /** The generated token ids, and whether its prompt's went out (return_token_ids). */
  tokenIds: number[];
  sentPromptIds: boolean;
  logprobs: CompletionLogprobs;
  offset: number;
  started: boolean;
  finishReason: FinishReason;
  stopReason: string | number | null;
}

export async function handleCompletion(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  refuseRequestLogitsProcessors(asJsonBody(request.body), ctx.logitsProcessorPattern);
  const req = forceUsage(ctx, parseCompletionRequest(request.body, ctx.tokenizer.vocabSize));
  if (ctx.skipTokenizerInit) refuseWithoutTokenizer(req);
  const { model, lora } = resolveModelAndLora(ctx, req.model);
  // echo repeats the prompt as given; its tokens (and their logprobs) are those left by truncate_prompt_tokens
  const prepared: Prepared[] = [...embeddedPrompts(ctx, req), ...req.prompts.map((p): Prepared =>
    "text" in p
      ? { promptText: p.text, fromText: true, promptTokenIds: truncatePrompt(ctx, req, { text: p.text, addSpecialTokens: req.addSpecialTokens }) }
      : { promptTokenIds: truncatePrompt(ctx, req, p.tokenIds), fromText: false, promptText: ctx.tokenizer.decode(p.tokenIds, { skipSpecialTokens: false }) },
  )];
  const params = prepared.map((p) => samplingParamsFor(ctx, req, p.promptTokenIds.length, "prompt"));
  const { id, engineId } = responseIds(request, "cmpl");
  // a decode's K/V is fetched before the queue check, which must run in the tick its engine requests start
  const kvt = await planKvTransfer(ctx.kvTransfer, request.body as Json, prepared.length);
  if (kvt !== null && req.beamSearch !== null) throw badRequest("beam search does not move K/V between servers", "kv_transfer_params");
  checkQueue(ctx, prepared.length); // one engine request per prompt
  if (req.beamSearch !== null) {
    const disconnect = new AbortController();
    abortOnDisconnect(request, reply, disconnect);
    const { beams, usage } = await runBeamSearch(ctx, prepared.map((p) => p.promptTokenIds), params, req.beamSearch.lengthPenalty, lora, disconnect.signal);
    const choices = beams.flatMap((found, i) =>
      found.map((b, j) => ({
        index: i * found.length + j, text: b.text, logprobs: null, finish_reason: beamFinishReason(b), stop_reason: null,
        ...(req.returnTokenIds ? { prompt_token_ids: prepared[i]!.promptTokenIds, token_ids: b.tokenIds } : {}),
      })),
    );
    return { id, object: "text_completion", created: nowSeconds(), model, choices, usage };
  }

  const created = nowSeconds();
  const n = params[0]!.n ?? 1;
  const controller = new AbortController();
  abortOnDisconnect(request, reply, controller);
  const streams = prepared.map((p, i) =>
    streamEngineRequest(ctx.engine, ctx.metrics, ctx.inflight, ctx.unstarted, {
      requestId: `${engineId}-${i}`, promptTokenIds: p.promptTokenIds, prompt: p.promptText, params: params[i]!, ...(p.embeds ? { mmFeatures: [p.embeds] } : {}),
      priority: req.priority, ...(req.cacheSalt ? { cacheSalt: req.cacheSalt } : {}), loraRequest: lora, kvTransfer: kvt?.option ?? null, stream: req.stream, streamInterval: ctx.streamInterval,
    }, controller.signal, ctx.requestLog));
  const choices: Choice[] = [];
  for (let pi = 0; pi < prepared.length; pi++) {
    for (let s = 0; s < n; s++) {
      choices.push({ text: "", numTokens: 0, tokenIds: [], sentPromptIds: false, logprobs: emptyLogprobs(), offset: 0, started: false, finishReason: null, stopReason: null });
    }
  }
  try {
    const merged = await primeStream(mergeStreams(streams));
    const info: Info = {
      id, created, model, n, prepared, choices, promptLogprobs: prepared.map(() => null), cached: prepared.map(() => 0),
      asIds: req.returnTokensAsTokenIds ?? ctx.returnTokensAsTokenIds, kvt,
    };
    if (req.stream) return await streamCompletion(ctx, req, reply, merged, info);
    return await collectCompletion(ctx, req, merged, info);
  } finally {
    controller.abort();
  }
}

/**
 * The request's prompt_embeds as prompts (vLLM's order: before any text or token prompts). Refused without
 * --enable-prompt-embeds, and with what needs the prompt's tokens (echo, prompt logprobs, beam search).
 */
function embeddedPrompts(ctx: ServingContext, req: CompletionRequest): Prepared[] {
  if (req.promptEmbeds.length === 0) return [];
  if (!ctx.enablePromptEmbeds) throw badRequest("You must set `--enable-prompt-embeds` to input `prompt_embeds`.", "prompt_embeds");
  if (req.echo) throw badRequest("echo is not supported with prompt_embeds (the prompt has no tokens to repeat)", "echo");
  if (req.params.promptLogprobs != null) throw badRequest("prompt_logprobs is not supported with prompt_embeds", "prompt_logprobs");
  if (req.beamSearch !== null) throw badRequest("beam search is not supported with prompt_embeds", "use_beam_search");
  return req.promptEmbeds.map((b64) => {
    const e = readPromptEmbeds(b64, (seq) => truncatePrompt(ctx, req, new Array<number>(seq).fill(0)).length);
    return { promptTokenIds: e.promptTokenIds, promptText: "", fromText: false, embeds: e.feature };
  });
}

interface Info {
  /** Each prompt's prompt logprobs, from its first output that has them. */
  promptLogprobs: ((TokenLogprobs | null)[] | null)[];
  id: string;
  created: number;
  model: string;
  n: number;
  prepared: Prepared[];
  choices: Choice[];
  /** Each prompt's tokens read from the prefix cache (as its outputs report them). */
  cached: number[];
  /** Logprobs name tokens "token_id:<id>". */
  asIds: boolean;
  /** The request's kv_transfer_params, acted on; and a prefill's K/V once it has finished. */
  kvt: KvTransferPlan | null;
  kvSnapshot?: KvSnapshot;
}

/** Applies one delta output to its choice; returns the text and logprobs added by it (echo included). */
function applyOutput(ctx: ServingContext, req: CompletionRequest, info: Info, promptIndex: number, out: RequestOutput, o: CompletionOutput) {
  const c = info.choices[promptIndex * info.n + o.index]!;
  if (c.finishReason !== null) return null; // finished samples may be listed again with empty deltas
  let text = "";
  const lp = emptyLogprobs();
  if (!c.started) {
    c.started = true;
    if (req.echo) {
      const p = info.prepared[promptIndex]!;
      text += p.promptText;
      if (req.logprobs !== null) {
        p.echoOffsets ??= promptTextOffsets(ctx, p);
        appendLogprobs(ctx, lp, p.promptTokenIds, out.promptLogprobs ?? [], req.logprobs, 0, info.asIds, p.echoOffsets);
      }
      c.offset = charCount(p.promptText); // the generated tokens follow the whole echoed text
    }
  }
  if (out.promptLogprobs && info.promptLogprobs[promptIndex] === null) info.promptLogprobs[promptIndex] = out.promptLogprobs;
  info.cached[promptIndex] = out.numCachedTokens;
  if (!req.echoOnly) {
    text += o.text;
    if (req.logprobs !== null) c.offset = appendLogprobs(ctx, lp, o.tokenIds, o.logprobs ?? [], req.logprobs, c.offset, info.asIds);
    c.numTokens += o.tokenIds.length;
    if (req.returnTokenIds) c.tokenIds.push(...o.tokenIds);
  }
  c.text += text;
  for (const k of ["tokens", "token_logprobs", "top_logprobs", "text_offset"] as const) (c.logprobs[k] as unknown[]).push(...lp[k]);
  if (o.finishReason !== null) {
    c.finishReason = o.finishReason;
    c.stopReason = o.stopReason;
  }
  const tokenIds = req.echoOnly ? [] : o.tokenIds;
  return { index: promptIndex * info.n + o.index, text, logprobs: lp, tokenIds };
}

/** return_token_ids' fields of a choice: its prompt's token ids (once per choice in a stream) and its tokens. */
function tokenIdFields(req: CompletionRequest, info: Info, index: number, tokenIds: readonly number[]) {
  if (!req.returnTokenIds) return {};
  const c = info.choices[index]!;
  const p = info.prepared[Math.floor(index / info.n)]!;
  const prompt = c.sentPromptIds ? {} : { prompt_token_ids: p.embeds ? null : p.promptTokenIds };
  c.sentPromptIds = true;
  return { ...prompt, token_ids: [...tokenIds] };
}

function usageOf(ctx: ServingContext, info: Info) {
  const prompt = info.prepared.reduce((s, p) => s + p.promptTokenIds.length, 0);
  const completion = info.choices.reduce((s, c) => s + c.numTokens, 0);
  return usageJson(ctx, prompt, completion, info.cached.reduce((a, b) => a + b, 0));
}

async function collectCompletion(ctx: ServingContext, req: CompletionRequest, merged: AsyncIterable<[number, RequestOutput]>, info: Info) {
  for await (const [pi, out] of merged) {
    for (const o of out.outputs) applyOutput(ctx, req, info, pi, out, o);
    if (out.kvSnapshot !== undefined) info.kvSnapshot = out.kvSnapshot;
  }
  return {
    id: info.id,
    object: "text_completion",
    created: info.created,
    model: info.model,
    choices: info.choices.map((c, index) => ({
      index,
      text: c.text,
      logprobs: req.logprobs !== null ? c.logprobs : null,
      finish_reason: c.finishReason ?? "abort",
      stop_reason: c.stopReason,
      ...(req.returnPromptLogprobs ? { prompt_logprobs: promptLogprobsJson(info.promptLogprobs[Math.floor(index / info.n)] ?? null) } : {}),
      ...tokenIdFields(req, info, index, c.tokenIds),
    })),
    usage: usageOf(ctx, info),
    ...kvTransferField(ctx.kvTransfer, info.kvt, info.kvSnapshot),
  };
}

async function streamCompletion(
  ctx: ServingContext, req: CompletionRequest, reply: FastifyReply, merged: AsyncIterable<[number, RequestOutput]>, info: Info,
): Promise<FastifyReply> {
  const sse = new SseWriter(reply);
  const base = { id: info.id, object: "text_completion", created: info.created, model: info.model };
  const usageField = req.includeUsage ? { usage: null } : {};
  try {
    for await (const [pi, out] of merged) {
      for (const o of out.outputs) {
 const applied = applyOutput(ctx, req, info, pi, out, o);
        if (applied === null) continue;
        const { index, text, logprobs, tokenIds } = applied;
        if (text === "" && o.finishReason === null && o.tokenIds.length === 0) continue;
        const choice = {
          index, text, logprobs: req.logprobs !== null ? logprobs : null, finish_reason: o.finishReason,
          ...(o.finishReason !== null ? { stop_reason: o.stopReason } : {}),
          ...tokenIdFields(req, info, index, tokenIds),
        };
        // continuous_usage_stats: the chunk's own prompt and choice so far (vLLM's), not the whole request's
        const own = req.continuousUsageStats
          ? { usage: usageJson(ctx, info.prepared[pi]!.promptTokenIds.length, info.choices[index]!.numTokens, info.cached[pi]!) }
          : usageField;
        await sse.send({ ...base, choices: [choice], ...own });
      }
      if (sse.closed) break;
    }
    if (req.includeUsage) await sse.send({ ...base, choices: [], usage: usageOf(ctx, info) });
    await sse.end();
  } catch (err) {
    await sse.end(err);
  }
  return reply;
}
