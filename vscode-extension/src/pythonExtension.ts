// The Python extension's selected interpreter, when that extension is
// installed. It is optional (ruff-vscode style): without it the
// `fuselens.interpreter` setting or `python3` is used.

import * as vscode from "vscode";

const PYTHON_EXTENSION_ID = "ms-python.python";

interface PythonEnvironmentsApi {
  getActiveEnvironmentPath(resource?: vscode.Uri): { path: string };
  resolveEnvironment(env: { path: string } | string): Promise<{ executable: { uri?: vscode.Uri } } | undefined>;
  onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
}

/** The active environment's executable, or undefined without the Python extension. */
export async function activePythonEnvironment(
  resource: vscode.Uri | undefined,
  log: vscode.LogOutputChannel,
): Promise<string | undefined> {
  const api = await environmentsApi(log);
  if (!api) {
    return undefined;
  }
  try {
    const env = await api.resolveEnvironment(api.getActiveEnvironmentPath(resource));
    return env?.executable.uri?.fsPath;
  } catch (err) {
    log.warn(`Python extension did not resolve an interpreter: ${err instanceof Error ? err.message : String(err)}`);
    return undefined;
  }
}

/** Fires when the user picks another interpreter in the Python extension. */
export async function onDidChangePythonInterpreter(
  listener: () => void,
  log: vscode.LogOutputChannel,
): Promise<vscode.Disposable | undefined> {
  const api = await environmentsApi(log);
  return api?.onDidChangeActiveEnvironmentPath?.(listener);
}

async function environmentsApi(log: vscode.LogOutputChannel): Promise<PythonEnvironmentsApi | undefined> {
  const extension = vscode.extensions.getExtension<{ environments?: PythonEnvironmentsApi }>(PYTHON_EXTENSION_ID);
  if (!extension) {
    return undefined;
  }
  try {
    const exports = extension.isActive ? extension.exports : await extension.activate();
    return exports?.environments;
  } catch (err) {
    log.warn(`Python extension failed to activate: ${err instanceof Error ? err.message : String(err)}`);
    return undefined;
  }
}
