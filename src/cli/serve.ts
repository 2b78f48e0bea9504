// `kiln serve`: build the engine through the injected factory, start the HTTP server, drain on SIGTERM.
import type { EngineFactory } from "./engine-factory.js";
import { createProgress } from "./progress.js";
import type { ServeArgs } from "./serve-args.js";
import { KILN_VERSION } from "./version.js";

export async function runServe(args: ServeArgs, factory: EngineFactory, out: NodeJS.WritableStream = process.stdout): Promise<void> {
  const progress = createProgress();
  // The server's modules load on this thread while the engine worker loads the model; only once the worker
  // runs, as importing them first would delay its start by their ~0.1 s of compiling.
  let serverModules: Promise<[typeof import("../server/index.js"), typeof import("../server/shutdown.js")]> | null = null;
  const importServer = () => {
    serverModules ??= Promise.all([import("../server/index.js"), import("../server/shutdown.js")]);
    serverModules.catch(() => undefined); // awaited below; a failing factory must not leave it unhandled
  };
  const loaded = await factory(args, progress, importServer);
  importServer(); // a factory that never called whileLoading
  const [{ createServer }, { serveUntilSignal }] = await serverModules!;
  progress.done();
  const names = args.servedModelName ?? [loaded.modelName];
  const app = createServer({
    engine: loaded.engine,
    tokenizer: loaded.tokenizer,
    servedModelNames: names,
    maxModelLen: loaded.maxModelLen,
    version: KILN_VERSION,
    allowedOrigins: args.allowedOrigins,
    logRequests: args.logRequests,
    ...(args.apiKey ? { apiKey: args.apiKey } : {}),
    ...(args.maxWaitingRequests !== null ? { maxWaitingRequests: args.maxWaitingRequests } : {}),
    ...(loaded.generationDefaults ? { generationDefaults: loaded.generationDefaults } : {}),
    ...(args.chatTemplate !== null ? { chatTemplate: args.chatTemplate } : {}),
  });
  try {
    await app.listen({ host: args.host, port: args.port });
  } catch (err) {
    await loaded.close();
    throw err;
  }
  const addr = app.server.address();
  const port = addr && typeof addr === "object" ? addr.port : args.port;
  out.write(`Kiln serving ${names[0]} at http://${args.host}:${port}/v1\n`);
  await serveUntilSignal(app, { onClosed: () => loaded.close() });
}
