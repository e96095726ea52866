// Quoting a command line for the integrated terminal (`Open Profiler` types
// `<python> -m fuselens tui <file>` into it). Pure.

export type ShellKind = "posix" | "powershell" | "cmd";

/** Guesses the quoting rules from the terminal's shell path and the platform. */
export function shellKind(shellPath: string | undefined, platform: NodeJS.Platform): ShellKind {
  const name = (shellPath ?? "").toLowerCase().split(/[\\/]/).pop() ?? "";
  if (name.startsWith("pwsh") || name.startsWith("powershell")) {
    return "powershell";
  }
  if (name === "cmd.exe" || name === "cmd") {
    return "cmd";
  }
  if (name === "" && platform === "win32") {
    return "powershell"; // Windows' default terminal profile
  }
  return "posix";
}

const POSIX_SAFE = /^[A-Za-z0-9_@%+=:,./-]+$/;

/** Quotes one argument so the shell passes it through unchanged. */
export function quoteArg(arg: string, kind: ShellKind): string {
  if (kind === "posix") {
    if (arg !== "" && POSIX_SAFE.test(arg)) {
      return arg;
    }
    return `'${arg.replace(/'/g, `'\\''`)}'`;
  }
  if (kind === "powershell") {
    return `'${arg.replace(/'/g, "''")}'`;
  }
  // cmd.exe has no escape inside quotes; a double quote cannot appear in a path.
  return /[\s&|<>^()"]/.test(arg) || arg === "" ? `"${arg.replace(/"/g, '""')}"` : arg;
}

/** The full command line; PowerShell needs `&` to run a quoted executable. */
export function commandLine(argv: string[], kind: ShellKind): string {
  const quoted = argv.map((a) => quoteArg(a, kind)).join(" ");
  return kind === "powershell" ? `& ${quoted}` : quoted;
}

/** argv of the profiler: `<python...> -m fuselens tui <file>`. */
export function profilerArgv(interpreter: string[], file: string): string[] {
  return [...interpreter, "-m", "fuselens", "tui", file];
}
