// HOOK for commands owned by other areas: `train`, `init-model`, `convert` register themselves here.
// Each entry receives the root program and adds one subcommand, e.g.
//   (program) => program.command("train").argument("<recipe>").action(async (recipe) => { ... })
import type { Command } from "commander";
import { registerRunCommand } from "./launch.js";
import { registerRouterCommand } from "./router-command.js";
import { registerTrainCommands } from "./train-commands.js";

export type CommandRegistrar = (program: Command) => void;

export const extraCommands: CommandRegistrar[] = [registerTrainCommands, registerRunCommand, registerRouterCommand];
