// LoRA adapters as models (vLLM's OpenAIServingModels): each adapter is served under its own name, listed by
// /v1/models with the base model as parent, and with VLLM_ALLOW_RUNTIME_LORA_UPDATING loaded and unloaded at run
// time through /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's answers: plain-text success, OpenAI error
// objects otherwise).
import type { FastifyInstance } from "fastify";
import { EngineInputError } from "../engine/errors.js";
import { ApiError, badRequest } from "./errors.js";
import { randomId, type LoraModule, type ServingContext } from "./serving-context.js";

/** /v1/models entries of the served adapters. */
export function loraModelCards(ctx: ServingContext, created: number): object[] {
  return [...(ctx.loraModules?.values() ?? [])].map((m) => ({
    id: m.request.name,
    object: "model",
    created,
    owned_by: "kiln",
    root: m.request.path,
    parent: m.baseModelName,
    max_model_len: null,
    permission: [modelPermission(created)],
  }));
}

/** vLLM's ModelPermission with its defaults: every model card lists one. */
export function modelPermission(created: number): object {
  return {
    id: randomId("modelperm"), object: "model_permission", created, allow_create_engine: false, allow_sampling: true, allow_logprobs: true,
    allow_search_indices: false, allow_view: true, allow_fine_tuning: false, organization: "*", group: null, is_blocking: false,
  };
}

export function registerLoraRoutes(app: FastifyInstance, bound: () => ServingContext): void {
  const fields = (body: unknown, names: string[]): Record<string, string> => {
    const b = (typeof body === "object" && body !== null ? body : {}) as Record<string, unknown>;
    const out: Record<string, string> = {};
    for (const n of names) {
      const v = b[n];
      if (typeof v !== "string" || v === "")
        throw badRequest(names.length > 1 ? `Both ${names.map((x) => `'${x}'`).join(" and ")} must be provided.` : `'${n}' needs to be provided to unload a LoRA adapter.`, n);
      out[n] = v;
    }
    return out;
  };
  const loraModules = (ctx: ServingContext): Map<string, LoraModule> => {
    if (ctx.loraModules === null) throw badRequest("LoRA is not enabled: start the server with --enable-lora", "lora_name");
    return ctx.loraModules;
  };

  // names being loaded: a second load of one waits for none, it is refused (vLLM locks per name)
  const loading = new Set<string>();
  app.post("/v1/load_lora_adapter", async (request, reply) => {
    const ctx = bound();
    const { lora_name: name, lora_path: path } = fields(request.body, ["lora_name", "lora_path"]);
    const inplace = (request.body as { load_inplace?: unknown }).load_inplace === true;
    const modules = loraModules(ctx);
    if (ctx.servedModelNames.includes(name))
      throw badRequest(`'${name}' is the name of the served base model; choose another name for the LoRA adapter.`, "lora_name");
    const old = modules.get(name);
    if (loading.has(name) || (old !== undefined && !inplace))
      throw new ApiError(400, `The lora adapter '${name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.`,
        "lora_name", "invalid_request_error", "lora_already_loaded");
    // a new id even in place: the prefix cache keys on it, so blocks of the old weights are not reused
    const lora = { name, id: ++ctx.lastLoraId, path }; // ids are never reused, even after unloads
    loading.add(name);
    try {
      await ctx.engine.addLora!(lora);
    } catch (e) {
      if (!(e instanceof EngineInputError)) throw e;
      const missing = /no adapter_config\.json|no adapter_model\.safetensors/.test(e.message);
      throw new ApiError(missing ? 404 : 400, e.message, "lora_path", missing ? "not_found_error" : "invalid_request_error");
    } finally {
      loading.delete(name);
    }
    modules.set(name, { request: lora, baseModelName: ctx.servedModelNames[0]! });
    if (old !== undefined) await ctx.engine.removeLora?.(old.request.id); // requests still using it keep it until they end
    return reply.type("text/plain; charset=utf-8").send(`Success: LoRA adapter '${name}' added successfully.`);
  });

  app.post("/v1/unload_lora_adapter", async (request, reply) => {
    const ctx = bound();
    const { lora_name: name } = fields(request.body, ["lora_name"]);
    const modules = loraModules(ctx);
    const m = modules.get(name);
    if (m === undefined) throw new ApiError(404, `The lora adapter '${name}' cannot be found.`, "lora_name", "not_found_error", "lora_not_found");
    modules.delete(name); // new requests for it get 404 now; running ones finish with it
    await ctx.engine.removeLora?.(m.request.id); // false while requests still use it: the engine keeps it until they end
    return reply.type("text/plain; charset=utf-8").send(`Success: LoRA adapter '${name}' removed successfully.`);
  });
}
