// Start-up progress: a cli-progress bar per stage on a TTY, plain "stage... NN%" lines otherwise.
import cliProgress from "cli-progress";
import type { ProgressFn } from "./engine-factory.js";

export function createProgress(stream: NodeJS.WriteStream = process.stderr): ProgressFn & { done(): void } {
  const tty = Boolean(stream.isTTY);
  let stage: string | null = null;
  let bar: cliProgress.SingleBar | null = null;
  let lastStep = -1; // last quarter printed in plain mode

  const finishStage = (): void => {
    if (bar) {
      bar.update(100);
      bar.stop();
      bar = null;
    }
  };
  const fn = ((name: string, fraction?: number) => {
    if (name !== stage) {
      finishStage();
      stage = name;
      lastStep = -1;
      if (!tty || fraction === undefined) stream.write(`[kiln] ${name}...\n`);
    }
    if (fraction === undefined) return;
    const pct = Math.max(0, Math.min(100, Math.round(fraction * 100)));
    if (tty) {
      if (!bar) {
        bar = new cliProgress.SingleBar(
          { format: `[kiln] ${name.padEnd(18)} {bar} {percentage}%`, stream, hideCursor: true, clearOnComplete: false },
          cliProgress.Presets.shades_classic,
        );
        bar.start(100, 0);
      }
      bar.update(pct);
    } else if (Math.floor(pct / 25) > lastStep) {
      lastStep = Math.floor(pct / 25);
      stream.write(`[kiln] ${name}: ${pct}%\n`);
    }
  }) as ProgressFn & { done(): void };
  fn.done = finishStage;
  return fn;
}
