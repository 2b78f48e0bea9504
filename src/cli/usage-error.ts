// The error of a command line the user got wrong: `kiln` prints its message and exits with status 2.

/** A flag's value (or a combination of flags) that cannot work, named in the message, raised before anything loads. */
export class CliUsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "CliUsageError";
  }
}
