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
  /** The workspace's own environment was skipped because the window is restricted. */
  waitsForTrust?: string;
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
      const fallback = [c.platform === "win32" ? "python" : "python3"];
      return { command: fallback, source: "default", note, waitsForTrust: c.pythonExtension };
    } else {
      return { command: [c.pythonExtension], source: "python-extension" };
    }
  }
  return { command: [c.platform === "win32" ? "python" : "python3"], source: "default", note };
}

export interface StartFailure {
  message: string;
  /** Button label -> VS Code command it runs. */
  actions: Record<string, string>;
}

/**
 * What to tell the user when the server did not start. In Restricted Mode
 * with the workspace's own environment skipped, the honest answer is that
 * analysis waits for trust: VS Code ignores a workspace's fuselens.interpreter
 * there, so pointing at that setting would send the user in a circle.
 */
export function startFailure(choice: InterpreterChoice, trusted: boolean): StartFailure {
  if (!trusted && choice.waitsForTrust) {
    return {
      message:
        `FuseLens: this window is in Restricted Mode, so FuseLens does not start the workspace's Python ` +
        `(${choice.waitsForTrust}) and ${choice.command.join(" ")} has no fuselens. Analysis waits until you ` +
        `trust this folder; FuseLens then starts by itself.`,
      actions: { "Manage Workspace Trust": "workbench.trust.manage" },
    };
  }
  return {
    message:
      `FuseLens: the server did not start with ${choice.command.join(" ")}. Is fuselens installed in that ` +
      `environment (pip install fuselens)? Set fuselens.interpreter to choose another Python.`,
    actions: { "Show Log": "", "Open Settings": "workbench.action.openSettings" },
  };
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
