// Which Python runs the server. Pure: the caller gathers the candidates.
//
// Order, as in Microsoft's Python tools extension template: the
// `fuselens.interpreter` setting, then the Python extension's selected
// environment (optional: it is not a dependency, ruff-vscode style), then
// `python3` (`python` on Windows) from PATH.

import * as path from "path";

export interface InterpreterCandidates {
  /** `fuselens.interpreter` (already normalised); in a restricted window VS Code
   * drops a workspace-level value because the setting is a restricted one. */
  setting: string[];
  /** The Python extension's active environment executable, if it is installed. */
  pythonExtension?: string;
  trusted: boolean;
  /** File system paths of the open workspace folders. */
  workspaceFolders: string[];
  platform: NodeJS.Platform;
}

export interface InterpreterChoice {
  command: string[];
  source: "setting" | "python-extension" | "default";
  /** Why a candidate was skipped, for the log. */
  note?: string;
}

/** Picks the interpreter command (executable plus leading arguments). */
export function chooseInterpreter(c: InterpreterCandidates): InterpreterChoice {
  if (c.setting.length > 0) {
    return { command: c.setting, source: "setting" };
  }
  let note: string | undefined;
  if (c.pythonExtension) {
    // A virtualenv inside an untrusted folder is code that folder controls:
    // starting it would run workspace code before the user trusted it.
    if (!c.trusted && c.workspaceFolders.some((folder) => isInside(c.pythonExtension!, folder))) {
      note = `skipped ${c.pythonExtension}: it lives in the restricted workspace`;
    } else {
      return { command: [c.pythonExtension], source: "python-extension" };
    }
  }
  return { command: [c.platform === "win32" ? "python" : "python3"], source: "default", note };
}

/** The server's command line: `<python> -m fuselens server`. */
export function serverCommandLine(interpreter: string[]): { command: string; args: string[] } {
  const [command, ...rest] = interpreter;
  return { command, args: [...rest, "-m", "fuselens", "server"] };
}

/** True when `child` is `parent` or below it (path-wise, no symlink resolution). */
export function isInside(child: string, parent: string): boolean {
  const rel = path.relative(path.resolve(parent), path.resolve(child));
  return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel));
}
