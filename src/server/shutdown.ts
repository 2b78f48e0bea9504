// Graceful shutdown: on SIGTERM/SIGINT stop accepting, let in-flight requests finish, then exit.
import type { FastifyInstance } from "fastify";

export interface ServeUntilSignalOptions {
  signals?: NodeJS.Signals[];
  /** After this long, still-running requests are aborted (their streams end) so the drain can finish. */
  drainTimeoutMs?: number;
  /** Runs after the server has closed (e.g. engine shutdown). */
  onClosed?: () => Promise<void> | void;
  /** Exit the process when done (default true); tests pass false. */
  exit?: boolean;
  log?: (line: string) => void;
}

/**
 * Resolves with the signal name once the server has drained and closed.
 * @example await serveUntilSignal(app, { onClosed: () => engine.close() });
 */
export function serveUntilSignal(server: FastifyInstance, options: ServeUntilSignalOptions = {}): Promise<NodeJS.Signals> {
  const signals = options.signals ?? ["SIGTERM", "SIGINT"];
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  return new Promise((resolve) => {
    let closing = false;
    const onSignal = (signal: NodeJS.Signals): void => {
      if (closing) {
        log(`Received ${signal} again: exiting now`);
        process.exit(1);
      }
      closing = true;
      log(`Received ${signal}: draining ${server.kilnInflight()} in-flight request(s)`);
      let timedOut = false;
      const timer = setTimeout(() => {
        log("Drain timeout: aborting the remaining requests");
        timedOut = true;
        server.kilnAbortAll();
      }, options.drainTimeoutMs ?? 30_000);
      timer.unref();
      // Once no request is being handled (nor streaming), drop the remaining idle or request-less sockets so close()
      // can finish; after the drain timeout, whatever is left (e.g. an upload that never ends).
      const sweeper = setInterval(() => {
        if ((server.kilnActive() === 0 && server.kilnInflight() === 0) || timedOut) server.server.closeAllConnections();
      }, 100);
      sweeper.unref();
      void (async () => {
        try {
          await server.close();
          await options.onClosed?.();
        } catch (err) {
          log(`Error during shutdown: ${(err as Error).message}`);
        } finally {
          clearTimeout(timer);
          clearInterval(sweeper);
          for (const s of signals) process.off(s, onSignal);
          log("Server stopped");
          resolve(signal);
          if (options.exit ?? true) process.exit(0);
        }
      })();
    };
    for (const s of signals) process.on(s, onSignal);
  });
}
